// The CUDA device's fully connected maps through cuBLASLt (cublaslt.hpp; Note [Fused linear] in
// lockstep/device.hpp).
//
// cuBLASLt is column-major and lockstep's matrices are row-major: a row-major (r, c) matrix is
// its column-major transpose (c, r) with the same leading dimension. So every product below is
// asked for transposed, D^T = op(B)^T op(A)^T with the operands swapped, as CudaDevice::gemm does:
//   forward  y (rows, out) = x W^T:   D (out, rows) = op_T(W) (out, in) . x^T (in, rows)
//   dweight  dW (out, in) += g^T x:   D (in, out) = x^T (in, rows) . op_T(g^T) (rows, out)
//   dx       dx (rows, in) = g W:     D (in, rows) = W^T (in, out) . g^T (out, rows)
// which puts the bias (length out) along D's rows, as EPILOGUE_BIAS wants; BGRADB sums op(B)
// over k (the rows) into a vector of D's columns (out), and DGELU_BGRAD sums D over its columns
// into one of its rows (in).
#include "cuda/cublaslt.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"

namespace lockstep::cuda {
namespace {

// cuBLAS's recommendation for Hopper (32 MiB); enough for every earlier architecture too.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
// The widest bias gradient an epilogue writes (floats); a wider map falls back.
constexpr int kMaxBiasSums = 1 << 18;
// EPILOGUE_AUX_LD must be a multiple of this (cublasLt.h).
constexpr int kAuxLdMultiple = 8;

// The largest power of two, up to 256, that divides the address: what cuBLASLt's kernels may
// assume of it.
std::int64_t alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::int64_t a = 1;
  while (a < 256 && address % (2 * a) == 0) a *= 2;
  return p ? a : 0;
}

cudaDataType_t type_of(MatIn m) { return m.bf16 ? CUDA_R_16BF : CUDA_R_32F; }
const void* data_of(MatIn m) {
  return m.bf16 ? static_cast<const void*>(m.bf16) : static_cast<const void*>(m.f32);
}

// The statuses by which cuBLASLt says it has no kernel for a configuration (an epilogue with
// these types, a bias type, an alignment): the caller falls back. Any other failure throws.
bool refused(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}

template <class T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

// The matrix as stored: (rows, cols) column-major, before op().
LtLayout layout(cudaDataType_t type, cublasOperation_t op, int rows, int cols, int ld) {
  cublasLtMatrixLayout_t l = nullptr;
  if (op == CUBLAS_OP_T) std::swap(rows, cols);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, std::uint64_t(rows), std::uint64_t(cols), ld));
  return LtLayout(l);
}

}  // namespace

LtLinear::LtLinear(bool fuse_gelu) : fuse_gelu_(fuse_gelu) {
  cublasLtHandle_t h = nullptr;
  CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = CublasLtHandle(h);
  workspace_ = make_device_memory(kWorkspaceBytes);
  bias_sums_ = make_device_memory(kMaxBiasSums * sizeof(float));
}

void LtLinear::abandon() noexcept {
  (void)bias_sums_.release();
  (void)workspace_.release();
  (void)handle_.release();
}

bool LtLinear::forward(const LinearForward& f, cudaStream_t stream) {
  if (f.rows == 0) return true;
  const bool gelu = f.act == FusedActivation::gelu;
  if (gelu && (!fuse_gelu_ || f.out % kAuxLdMultiple != 0)) return false;
  const MatOut y = f.y, pre = f.pre;
  Problem p;
  p.ta = CUBLAS_OP_T;
  p.m = f.out, p.n = f.rows, p.k = f.in;
  p.a = data_of(f.weight), p.lda = f.in;
  p.b = data_of(f.x), p.ldb = f.in;
  p.ab_type = type_of(f.x);
  p.d = y.bf16 ? static_cast<void*>(y.bf16) : y.f32, p.ldd = f.out;
  p.d_type = y.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  p.epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  p.bias = f.bias;
  if (gelu) p.aux = pre.bf16 ? static_cast<void*>(pre.bf16) : pre.f32;
  return run(p, stream);
}

bool LtLinear::weight_grad(const LinearBackward& b, cudaStream_t stream) {
  if (b.rows == 0) return true;
  if (b.dbias && b.out > kMaxBiasSums) return false;
  Problem p;
  p.tb = CUBLAS_OP_T;
  p.m = b.in, p.n = b.out, p.k = b.rows;
  p.a = data_of(b.x), p.lda = b.in;
  p.b = data_of(b.g), p.ldb = b.out;
  p.ab_type = type_of(b.g);
  p.d = b.dweight, p.ldd = b.in;
  p.beta = 1.0f;
  if (b.dbias) {
    p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    p.bias = bias_sums_.get();
  }
  if (!run(p, stream)) return false;
  if (b.dbias) add_bias_sums(b.dbias, b.out, stream);
  return true;
}

bool LtLinear::input_grad(const LinearBackward& b, cudaStream_t stream) {
  if (!b.dx || b.rows == 0) return true;
  const bool gelu = b.act == FusedActivation::gelu;
  if (gelu && !dgelu_fits(b)) return false;
  Problem p;
  p.m = b.in, p.n = b.rows, p.k = b.out;
  p.a = data_of(b.weight), p.lda = b.in;
  p.b = data_of(b.g), p.ldb = b.out;
  p.ab_type = type_of(b.g);
  p.d = b.dx, p.ldd = b.in;
  if (gelu) {
    if (b.dx_bf16) p.d = b.dx_bf16, p.d_type = CUDA_R_16BF;
    p.epilogue = b.dbias_pre ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    p.aux = const_cast<void*>(data_of(b.pre));  // read only, in the backward epilogues
    if (b.dbias_pre) p.bias = bias_sums_.get();
  }
  if (!run(p, stream)) return false;
  if (b.dbias_pre) add_bias_sums(b.dbias_pre, b.in, stream);
  return true;
}

// GELU's input is read in D's type: bf16 when the gradient is written rounded, fp32 otherwise;
// its leading dimension a multiple of 8, its bias gradient within bias_sums_.
bool LtLinear::dgelu_fits(const LinearBackward& b) const {
  const bool aux_type = b.dx_bf16 ? b.pre.bf16 != nullptr : b.pre.f32 != nullptr;
  return fuse_gelu_ && aux_type && b.in % kAuxLdMultiple == 0 &&
         (!b.dbias_pre || b.in <= kMaxBiasSums);
}

void LtLinear::add_bias_sums(float* into, int n, cudaStream_t stream) {
  const auto* sums = static_cast<const float*>(bias_sums_.get());
  launch_add(stream, into, sums, into, static_cast<std::size_t>(n));
}

LtLinear::Key LtLinear::key_of(const Problem& p) const {
  return {p.ta, p.tb, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.ab_type, p.d_type, p.epilogue,
          p.beta != 0.0f, tf32_, alignment(p.a), alignment(p.b), alignment(p.d),
          alignment(p.bias), alignment(p.aux)};
}

std::optional<cublasLtMatmulAlgo_t> LtLinear::algorithm(const Problem& p,
                                                        cublasLtMatmulDesc_t desc,
                                                        cublasLtMatrixLayout_t a,
                                                        cublasLtMatrixLayout_t b,
                                                        cublasLtMatrixLayout_t d) {
  const Key key = key_of(p);
  if (const auto it = algorithms_.find(key); it != algorithms_.end()) return it->second;
  cublasLtMatmulPreference_t raw = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  const LtPreference pref(raw);
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, attribute, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{kWorkspaceBytes});
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::uint32_t(alignment(p.a)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::uint32_t(alignment(p.b)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::uint32_t(alignment(p.d)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::uint32_t(alignment(p.d)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_.get(), desc, a, b, d, d,
                                                               pref.get(), 1, &result, &found);
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS)
    algo = result.algo;
  else if (!refused(status))
    check(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  algorithms_.emplace(key, algo);
  return algo;
}

bool LtLinear::run(const Problem& p, cudaStream_t stream) {
  const cublasComputeType_t compute = p.ab_type == CUDA_R_32F && tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw, compute, CUDA_R_32F));
  const LtMatmulDesc desc(raw);
  set(raw, CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(p.ta));
  set(raw, CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(p.tb));
  set(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(p.epilogue));
  if (p.bias) {
    set(raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    set(raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, std::int32_t(CUDA_R_32F));
  }
  if (p.aux) {
    set(raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(p.aux));
    set(raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t(p.ldd));
  }
  const LtLayout a = layout(p.ab_type, p.ta, p.m, p.k, p.lda);
  const LtLayout b = layout(p.ab_type, p.tb, p.k, p.n, p.ldb);
  const LtLayout d = layout(p.d_type, CUBLAS_OP_N, p.m, p.n, p.ldd);
  const std::optional<cublasLtMatmulAlgo_t> algo = algorithm(p, raw, a.get(), b.get(), d.get());
  if (!algo) return false;
  const float alpha = 1.0f;
  const cublasStatus_t status =
      cublasLtMatmul(handle_.get(), raw, &alpha, p.a, a.get(), p.b, b.get(), &p.beta, p.d,
                     d.get(), p.d, d.get(), &*algo, workspace_.get(), kWorkspaceBytes, stream);
  // Refused before anything was queued (a configuration the heuristic let through): fall back,
  // and for good, as for a problem without an algorithm.
  if (refused(status)) {
    algorithms_[key_of(p)] = std::nullopt;
    return false;
  }
  check(status, "cublasLtMatmul", __FILE__, __LINE__);
  return true;
}

}  // namespace lockstep::cuda
