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
#include <cstdio>
#include <string>
#include <utility>

#include <fmt/format.h>

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
const char* type_name(cudaDataType_t t) { return t == CUDA_R_16BF ? "bf16" : "fp32"; }

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    default: return "another epilogue";
  }
}

// The product, for messages: which of the map's products, its shape, types and epilogue.
std::string describe(const LtProblem& p) {
  return fmt::format("linear {} (m={} n={} k={}, A/B {}, D {}, epilogue {}{})", p.what, p.m, p.n,
                     p.k, type_name(p.ab_type), type_name(p.d_type), epilogue_name(p.epilogue),
                     p.bias ? fmt::format(", bias {}", type_name(p.bias_type)) : "");
}

// A performance hint, once per problem: which product falls back, its shape and why.
void report_refusal(const LtProblem& p, const std::string& reason) {
  fmt::print(stderr,
             "lockstep: warning: cuBLASLt refuses the {}: {}; it runs partly fused or composed "
             "(fused_linear in the summary counts it). This is not an error, but may impair "
             "performance.\n",
             describe(p), reason);
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

// The pointers a plan's descriptor carries, set before each call (and before the heuristic,
// which reads their alignment).
void set_pointers(cublasLtMatmulDesc_t desc, const LtProblem& p) {
  if (p.bias) set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  if (p.aux) set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(p.aux));
}

}  // namespace

LtAnswer heuristic_answer(cublasStatus_t status, int found, cublasStatus_t state) {
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return LtAnswer::refused;
  if (status != CUBLAS_STATUS_SUCCESS) return LtAnswer::error;
  if (found <= 0 || state == CUBLAS_STATUS_NOT_SUPPORTED) return LtAnswer::refused;
  return state == CUBLAS_STATUS_SUCCESS ? LtAnswer::run : LtAnswer::error;
}

LtAnswer matmul_answer(cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return LtAnswer::run;
  return status == CUBLAS_STATUS_NOT_SUPPORTED ? LtAnswer::refused : LtAnswer::error;
}

LtKey lt_key(const LtProblem& p, bool tf32) {
  return {p.ta,        p.tb,          p.m,           p.n,           p.k,
          p.lda,       p.ldb,         p.ldd,         p.ab_type,     p.d_type,
          p.epilogue,  p.beta != 0.0f, tf32,         p.bias_type,   alignment(p.a),
          alignment(p.b), alignment(p.d), alignment(p.bias), alignment(p.aux)};
}

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
  LtProblem p;
  p.what = "forward";
  p.ta = CUBLAS_OP_T;
  p.m = f.out, p.n = f.rows, p.k = f.in;
  p.a = data_of(f.weight), p.lda = f.in;
  p.b = data_of(f.x), p.ldb = f.in;
  p.ab_type = type_of(f.x);
  p.d = y.bf16 ? static_cast<void*>(y.bf16) : y.f32, p.ldd = f.out;
  p.d_type = y.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  p.epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  p.bias = data_of(f.bias), p.bias_type = type_of(f.bias);  // y's storage (check_linear)
  if (gelu) p.aux = pre.bf16 ? static_cast<void*>(pre.bf16) : pre.f32;
  return run(p, stream);
}

bool LtLinear::weight_grad(const LinearBackward& b, cudaStream_t stream) {
  if (b.rows == 0) return true;
  if (b.dbias && b.out > kMaxBiasSums) return false;
  LtProblem p;
  p.what = "weight gradient";
  p.tb = CUBLAS_OP_T;
  p.m = b.in, p.n = b.out, p.k = b.rows;
  p.a = data_of(b.x), p.lda = b.in;
  p.b = data_of(b.g), p.ldb = b.out;
  p.ab_type = type_of(b.g);
  p.d = b.dweight, p.ldd = b.in;
  p.beta = 1.0f;
  if (b.dbias) {
    p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    p.bias = bias_sums_.get(), p.bias_type = CUDA_R_32F;  // dweight's type
  }
  if (!run(p, stream)) return false;
  if (b.dbias) add_bias_sums(b.dbias, b.out, p.bias_type, stream);
  return true;
}

bool LtLinear::input_grad(const LinearBackward& b, cudaStream_t stream, bool bias_epilogue) {
  if (!b.dx || b.rows == 0) return true;
  const bool gelu = b.act == FusedActivation::gelu;
  if (gelu && !dgelu_fits(b)) return false;
  LtProblem p;
  p.what = "input gradient";
  p.m = b.in, p.n = b.rows, p.k = b.out;
  p.a = data_of(b.weight), p.lda = b.in;
  p.b = data_of(b.g), p.ldb = b.out;
  p.ab_type = type_of(b.g);
  p.d = b.dx, p.ldd = b.in;
  if (b.dx_bf16) p.d = b.dx_bf16, p.d_type = CUDA_R_16BF;  // rounded only (Note [Fused linear])
  const bool bgrad = gelu && b.dbias_pre && bias_epilogue;
  if (gelu) {
    p.epilogue = bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    p.aux = const_cast<void*>(data_of(b.pre));  // read only, in the backward epilogues
    if (bgrad) p.bias = bias_sums_.get(), p.bias_type = p.d_type;  // in D's type
  }
  if (!run(p, stream)) return false;
  if (bgrad) {
    add_bias_sums(b.dbias_pre, b.in, p.bias_type, stream);
  } else if (gelu && b.dbias_pre) {
    if (b.dx_bf16)
      launch_bias_grad_bf16(stream, b.dbias_pre, b.dx_bf16, b.rows, b.in);
    else
      launch_bias_grad(stream, b.dbias_pre, b.dx, b.rows, b.in);
  }
  return true;
}

// GELU's input is read in D's type: bf16 when the gradient is written rounded, fp32 otherwise;
// its leading dimension a multiple of 8, its bias gradient within bias_sums_.
bool LtLinear::dgelu_fits(const LinearBackward& b) const {
  const bool aux_type = b.dx_bf16 ? b.pre.bf16 != nullptr : b.pre.f32 != nullptr;
  return fuse_gelu_ && aux_type && b.in % kAuxLdMultiple == 0 &&
         (!b.dbias_pre || b.in <= kMaxBiasSums);
}

void LtLinear::add_bias_sums(float* into, int n, cudaDataType_t type, cudaStream_t stream) {
  if (type == CUDA_R_16BF) {  // one row of bf16 sums, widened as added
    launch_bias_grad_bf16(stream, into, static_cast<const std::uint16_t*>(bias_sums_.get()), 1, n);
    return;
  }
  const auto* sums = static_cast<const float*>(bias_sums_.get());
  launch_add(stream, into, sums, into, static_cast<std::size_t>(n));
}

LtLinear::Plan& LtLinear::plan(const LtProblem& p) {
  const LtKey key = lt_key(p, tf32_);
  if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
  const cublasComputeType_t compute = p.ab_type == CUDA_R_32F && tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw, compute, CUDA_R_32F));
  Plan made{LtMatmulDesc(raw), layout(p.ab_type, p.ta, p.m, p.k, p.lda),
            layout(p.ab_type, p.tb, p.k, p.n, p.ldb),
            layout(p.d_type, CUBLAS_OP_N, p.m, p.n, p.ldd), std::nullopt};
  set(raw, CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(p.ta));
  set(raw, CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(p.tb));
  set(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(p.epilogue));
  if (p.bias) set(raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, std::int32_t(p.bias_type));
  if (p.aux) set(raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t(p.ldd));
  set_pointers(raw, p);
  made.algo = algorithm(p, made);
  return plans_.emplace(key, std::move(made)).first->second;
}

std::optional<cublasLtMatmulAlgo_t> LtLinear::algorithm(const LtProblem& p, const Plan& plan) {
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
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_.get(), plan.desc.get(), plan.a.get(), plan.b.get(),
                                     plan.d.get(), plan.d.get(), pref.get(), 1, &result, &found);
  switch (heuristic_answer(status, found, result.state)) {
    case LtAnswer::run: return result.algo;
    case LtAnswer::refused:
      report_refusal(p, status != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName(status)
                                                        : "the heuristic found no algorithm");
      return std::nullopt;
    case LtAnswer::error: break;
  }
  check(status != CUBLAS_STATUS_SUCCESS ? status : result.state,
        fmt::format("cublasLtMatmulAlgoGetHeuristic for the {}", describe(p)).c_str(), __FILE__,
        __LINE__);
  return std::nullopt;  // not reached: check throws
}

bool LtLinear::run(const LtProblem& p, cudaStream_t stream) {
  Plan& plan = this->plan(p);
  if (!plan.algo) return false;
  set_pointers(plan.desc.get(), p);
  const float alpha = 1.0f;
  const cublasStatus_t status = cublasLtMatmul(
      handle_.get(), plan.desc.get(), &alpha, p.a, plan.a.get(), p.b, plan.b.get(), &p.beta, p.d,
      plan.d.get(), p.d, plan.d.get(), &*plan.algo, workspace_.get(), kWorkspaceBytes, stream);
  switch (matmul_answer(status)) {
    case LtAnswer::run: return true;
    // Refused before anything was queued (a configuration the heuristic let through): fall
    // back, and for good, as for a problem without an algorithm.
    case LtAnswer::refused:
      report_refusal(p, fmt::format("cublasLtMatmul: {}", cublasGetStatusName(status)));
      plan.algo = std::nullopt;
      return false;
    case LtAnswer::error: break;
  }
  check(status, fmt::format("cublasLtMatmul for the {}", describe(p)).c_str(), __FILE__, __LINE__);
  return false;  // not reached: check throws
}

}  // namespace lockstep::cuda
