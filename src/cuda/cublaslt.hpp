// A CUDA device's fully connected maps as cuBLASLt matmuls with fused epilogues (Note [Fused
// linear] in lockstep/device.hpp): the bias and GELU in the forward product, the bias gradient
// in the weight-gradient product, GELU's backward and the previous map's bias gradient in the
// input-gradient product.
//
//   LtLinear lt;                                     // on the device's thread, device current
//   if (!lt.forward(f, stream)) compose_linear_forward(device, f);
//
// Each call returns false, having queued nothing, where cuBLASLt has no algorithm for its
// problem; the caller then runs the composition of plain ops. The chosen algorithm (or its
// absence) is cached per problem: shapes, types, epilogue and the operands' alignments, so the
// heuristic runs once per layer shape, at the warm-up.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>

#include "cuda/handles.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cuda {

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
  // dx = g weight, with act gelu times gelu'(pre) (into dx_bf16 when set) and dbias_pre += its
  // column sums.
  bool input_grad(const LinearBackward& b, cudaStream_t stream);

  // Gives up every handle without freeing it (after an abort, with work still queued).
  void abandon() noexcept;

  // One cuBLASLt product in its column-major terms: D (m, n) = op(A) (m, k) op(B) (k, n) +
  // beta D, with the epilogue's bias (length m, or n for BGRADB) and aux matrix (m, n).
  struct Problem {
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
    const void* bias = nullptr;  // fp32: the bias, or where a bias gradient is written
    void* aux = nullptr;         // GELU's input, in D's type, leading dimension ldd
  };

 private:
  using Key = std::array<std::int64_t, 18>;
  Key key_of(const Problem& p) const;
  // The cached algorithm for p, asking the heuristic the first time; none when there is none.
  std::optional<cublasLtMatmulAlgo_t> algorithm(const Problem& p, cublasLtMatmulDesc_t desc,
                                                cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                cublasLtMatrixLayout_t d);
  bool run(const Problem& p, cudaStream_t stream);
  // Whether input_grad's GELU backward can be its product's epilogue.
  bool dgelu_fits(const LinearBackward& b) const;
  // The bias gradient written into bias_sums_ (`n` floats), then added to `into` on `stream`.
  void add_bias_sums(float* into, int n, cudaStream_t stream);

  CublasLtHandle handle_;
  DeviceMemory workspace_;
  DeviceMemory bias_sums_;  // kMaxBiasSums floats: where epilogues write bias gradients
  bool fuse_gelu_;
  bool tf32_ = false;
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algorithms_;
};

}  // namespace lockstep::cuda
