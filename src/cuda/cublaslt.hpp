// A CUDA device's fully connected maps as cuBLASLt matmuls with fused epilogues (Note [Fused
// linear] in lockstep/device.hpp): the bias and GELU in the forward product, the bias gradient
// in the weight-gradient product, GELU's backward and the previous map's bias gradient in the
// input-gradient product.
//
//   LtLinear lt;                                     // on the device's thread, device current
//   if (!lt.forward(f, stream)) compose_linear_forward(device, f);
//
// Each call returns false, having queued nothing, where cuBLASLt refuses its problem (no
// algorithm, or CUBLAS_STATUS_NOT_SUPPORTED); the caller then runs a partly fused or composed
// form and counts it (LinearCounts). Any other failure throws with the call's text. A problem's
// descriptor, layouts and algorithm (or refusal) are made once and cached per problem: shapes,
// types, epilogue and the operands' alignments, so nothing is created inside a step after the
// warm-up; each refusal is reported once on stderr with its shape and reason.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>

#include "cuda/handles.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cuda {

// One cuBLASLt product in its column-major terms: D (m, n) = op(A) (m, k) op(B) (k, n) +
// beta D, with the epilogue's bias (length m, or n for BGRADB) and aux matrix (m, n).
struct LtProblem {
  const char* what = "";  // for messages: "forward", "weight gradient", "input gradient"
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  cudaDataType_t ab_type = CUDA_R_32F;
  void* d = nullptr;
  int ldd = 0;
  cudaDataType_t d_type = CUDA_R_32F;
  float beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // The bias, or where a bias gradient is written, in bias_type: D's type, as cuBLASLt
  // documents for every non-FP8, non-IMMA kernel (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;  // GELU's input, in D's type, leading dimension ldd
};

// What cuBLASLt's answer means for a problem: a kernel to run; a refusal (no kernel for this
// configuration: CUBLAS_STATUS_NOT_SUPPORTED, or a heuristic that found none), on which the
// caller falls back; or an error (anything else, CUBLAS_STATUS_INVALID_VALUE included: a bug
// in what we asked), which throws.
enum class LtAnswer { run, refused, error };
// cublasLtMatmulAlgoGetHeuristic's status, the results it found and the first one's state.
LtAnswer heuristic_answer(cublasStatus_t status, int found, cublasStatus_t state);
// cublasLtMatmul's status.
LtAnswer matmul_answer(cublasStatus_t status);

// What a problem's cached plan depends on: everything but the pointers' values, of which only
// their alignment (the largest power of two up to 256 dividing the address) counts.
using LtKey = std::array<std::int64_t, 19>;
LtKey lt_key(const LtProblem& p, bool tf32);

class LtLinear {
 public:
  // fuse_gelu false: problems with GELU are left to the caller (LOCKSTEP_CUDA_LINEAR=bias).
  explicit LtLinear(bool fuse_gelu);
  LtLinear(const LtLinear&) = delete;
  LtLinear& operator=(const LtLinear&) = delete;

  // fp32 products on TF32 tensor cores (CudaDevice::set_tf32).
  void set_tf32(bool enabled) { tf32_ = enabled; }

  // y = act(x weight^T + bias), and pre with act gelu.
  bool forward(const LinearForward& f, cudaStream_t stream);
  // dweight += g^T x, and dbias += column sums of g.
  bool weight_grad(const LinearBackward& b, cudaStream_t stream);
  // dx = g weight (into dx_bf16 alone when set), with act gelu times gelu'(pre) and dbias_pre +=
  // its column sums: in the epilogue (DGELU_BGRAD), or with bias_epilogue false by the bias_grad
  // kernel over the gradient the DGELU epilogue wrote (rounded, when it wrote dx_bf16).
  bool input_grad(const LinearBackward& b, cudaStream_t stream, bool bias_epilogue = true);

  // Gives up every handle without freeing it (after an abort, with work still queued).
  void abandon() noexcept;

  // Cached plans so far: one per problem the layers asked for (tests).
  std::size_t plans() const noexcept { return plans_.size(); }

 private:
  // A problem's descriptor and layouts, and its algorithm; none when cuBLASLt refused it.
  struct Plan {
    LtMatmulDesc desc;
    LtLayout a, b, d;
    std::optional<cublasLtMatmulAlgo_t> algo;
  };
  Plan& plan(const LtProblem& p);
  std::optional<cublasLtMatmulAlgo_t> algorithm(const LtProblem& p, const Plan& plan);
  bool run(const LtProblem& p, cudaStream_t stream);
  // Whether input_grad's GELU backward can be its product's epilogue.
  bool dgelu_fits(const LinearBackward& b) const;
  // The bias gradient an epilogue wrote into bias_sums_ (`n` values of `type`), added to `into`.
  void add_bias_sums(float* into, int n, cudaDataType_t type, cudaStream_t stream);

  CublasLtHandle handle_;
  DeviceMemory workspace_;
  DeviceMemory bias_sums_;  // kMaxBiasSums floats: where epilogues write bias gradients
  bool fuse_gelu_;
  bool tf32_ = false;
  std::map<LtKey, Plan> plans_;
};

}  // namespace lockstep::cuda
