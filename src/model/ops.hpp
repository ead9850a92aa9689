// Building blocks shared by the layers: matrix products in either precision (common/linear.hpp),
// a fully connected map on rows, and carving a layer's workspace into regions.
//
// Shapes: x (rows, in), weight (out, in) as torch.nn.Linear, bias (out), y (rows, out).
// Backward accumulates into dweight and dbias (+=) and overwrites dx (=).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/linear.hpp"
#include "common/random.hpp"
#include "lockstep/device.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

// Note [bf16 compute]
// ~~~~~~~~~~~~~~~~~~~
// trainer.precision: bf16 is mixed precision as PyTorch's autocast and llm.c do it: fp32 master
// weights and optimiser state, bf16 inputs to every matrix product, fp32 for the rest. The CPU
// backend is the reference for where values are rounded (to nearest even, Note [Rounding to
// bf16] in src/common/bf16.hpp); the CUDA backend runs the same layer code through the same
// Device ops.
//
// - Weights. The Replica keeps the fp32 master parameters and a bf16 copy with the same layout.
//   load_parameters() writes it; every optimiser step writes it in the same pass as the update
//   (sgd_step/adamw_step's params_bf16), so the copy costs no extra pass. Under ZeRO-1 a rank
//   updates only its shards, so after the parameter all-gather the copy of the whole buffer is
//   refreshed by one to_bf16. The copy is always to_bf16(master): checkpoints keep the fp32
//   master only, and a bf16 run resumes exactly. Layers find their bf16 parameters in
//   LayerWorkspace::params_bf16, at the offsets of their fp32 ones.
// - Matrix products read bf16 operands (Device::gemm_bf16: each product exact in fp32, sums
//   accumulated in fp32) into fp32 outputs: weights from the copy, activations rounded where
//   they are stored, and output gradients rounded just before dW += dY^T X and dX = dY W. dW
//   accumulates in fp32 (beta 1), so accumulate_steps stays exact to fp32 rounding.
// - fp32 everywhere else: bias adds and bias gradients, LayerNorm, softmax, GELU, the residual
//   stream and the loss, reading widened bf16 values where the input is stored in bf16. A
//   linear map whose output is kept in bf16 (qkv, c_fc) adds its bias's bf16 copy, as
//   cuBLASLt's bias epilogue reads it (Note [Fused linear]). The embedding lookup reads the
//   fp32 master wte and wpe (autocast does not cast embeddings either; a frozen embedding, held
//   in bf16 only, reads its bf16 tables widened: Note [Frozen parameters] in lora.cpp); the LM
//   head's -inf padding product stays fp32.
// - Activations kept for backward are stored in bf16 where they are only matrix-product inputs
//   (a GPT block's ln_1, qkv, attention probabilities, attention output, ln_2 and GELU output;
//   a Linear's and the LM head's input). The block's c_fc output (GELU's input) is stored in
//   bf16 too, and GELU's forward and backward both read its widened value, so they agree. The
//   first residual stays fp32: it is a LayerNorm input.
// - The roundings and widenings live in the kernels that produce or consume the values, not in
//   passes of their own: the Device ops' bf16-storage overloads (LayerNorm writing bf16,
//   add_bias rounding a product plus its bias into the kept tensor, GELU reading and writing
//   bf16, the causal softmax writing bf16 probabilities and its backward reading them and
//   writing the rounded score gradient), each bit for bit the fp32 op between from_bf16 and
//   to_bf16. A GPT's LM head writes its logits in bf16 (computed in fp32 a chunk of rows at a
//   time), and the fused classifier reads them and writes their bf16 gradient over them
//   (softmax_cross_entropy with bf16 logits, in Replica::dlogits_bf16; Layer::dout_bf16; Note
//   [Fused classifier] in src/cpu/ops/softmax.cpp), so a bf16 step has neither fp32 logits in
//   full nor fp32 dlogits. A matrix product's fp32 output (attention's atty) and a gradient
//   that arrives from another layer are still rounded by to_bf16. fp32 and tf32 run exactly as
//   before.
// - The linear maps reach their products, bias adds, GELU and bias gradients through one Device
//   op (linear_forward, linear_backward; Note [Fused linear] in lockstep/device.hpp), which the
//   CPU composes from the ops above, so the rounding points here define it; the CUDA device
//   fuses them into cuBLASLt's epilogues, rounding in a few places differently (that note).

// C_i = op(A_i) op(B_i) + beta C_i (gemm_batched) with A and B in either storage.
inline void matmul_batched(Device& dev, Transpose ta, Transpose tb, int m, int n, int k, MatIn a,
                           int lda, std::int64_t stride_a, MatIn b, int ldb, std::int64_t stride_b,
                           float* c, int ldc, std::int64_t stride_c, int count,
                           float beta = 0.0f) {
  if (a.bf16)
    dev.gemm_batched_bf16(ta, tb, m, n, k, 1.0f, a.bf16, lda, stride_a, b.bf16, ldb, stride_b,
                          beta, c, ldc, stride_c, count);
  else
    dev.gemm_batched(ta, tb, m, n, k, 1.0f, a.f32, lda, stride_a, b.f32, ldb, stride_b, beta, c,
                     ldc, stride_c, count);
}

// x (n) as a matrix-product input: itself, or rounded into bf16 (n) when bf16 is not null.
inline MatIn as_input(Device& dev, const float* x, std::uint16_t* bf16, std::size_t n) {
  if (!bf16) return {x, nullptr};
  dev.to_bf16(x, bf16, n);
  return {nullptr, bf16};
}

// The parameter at `offset` (elements into a layer's parameters) as the layer's matrix products
// read it: from LayerWorkspace::params_bf16 under bf16, from the fp32 params otherwise.
inline MatIn param_input(const float* params, const LayerWorkspace& ws, std::size_t offset) {
  if (ws.precision == Precision::bf16) return {nullptr, ws.params_bf16 + offset};
  return {params + offset, nullptr};
}

// A linear layer's weight and bias: the weight as matrix products read it (bf16 or fp32); the
// fp32 master bias, and under bf16 its copy in the bf16 weights (null otherwise), which a bf16
// output's bias add reads (LinearForward::bias).
struct LinearParams {
  MatIn weight;
  const float* bias;
  const std::uint16_t* bias_bf16 = nullptr;
  // The bias in the storage of an output `y`.
  MatIn bias_for(MatOut y) const {
    return y.bf16 ? MatIn{nullptr, bias_bf16} : MatIn{bias, nullptr};
  }
};

// The linear layer whose weight and bias lie at these offsets of a layer's parameters.
inline LinearParams linear_params(const float* params, const LayerWorkspace& ws,
                                  std::size_t weight, std::size_t bias) {
  return {param_input(params, ws, weight), params + bias, param_input(params, ws, bias).bf16};
}

// y (rows, out) = x * weight^T + bias in y's storage (Device::linear_forward); `product` is fp32
// (rows, out) working memory for a bf16 y.
inline void linear_forward(Device& dev, LinearParams p, MatIn x, MatOut y, float* product,
                           int rows, int in, int out) {
  dev.linear_forward({.rows = rows, .in = in, .out = out, .x = x, .weight = p.weight,
                      .bias = p.bias_for(y), .y = y, .product = product});
}

// dweight (out, in) += dy^T * x; dbias (out) += column sums of dy; dx (rows, in) = dy * weight,
// skipped when dx is null (Device::linear_backward). With bf16 weights the products read dy
// rounded into dy_bf16 (rows, out) first.
inline void linear_backward(Device& dev, LinearParams p, float* dweight, float* dbias, MatIn x,
                            const float* dy, float* dx, int rows, int in, int out,
                            std::uint16_t* dy_bf16 = nullptr) {
  const MatIn g = as_input(dev, dy, p.weight.bf16 ? dy_bf16 : nullptr, std::size_t(rows) * out);
  dev.linear_backward({.rows = rows, .in = in, .out = out, .x = x, .weight = p.weight, .dy = dy,
                       .g = g, .dweight = dweight, .dbias = dbias, .dx = dx});
}

// Floats that hold n bf16 values, rounded up to whole 64-byte lines so that whatever follows a
// bf16 region stays as aligned as the region.
constexpr std::size_t bf16_floats(std::size_t n) {
  constexpr std::size_t line = 64 / sizeof(float);
  return ((n + 1) / 2 + line - 1) / line * line;
}

// The layers' initialisation: GPT-2's N(0, 0.02), also Hugging Face's initializer_range.
constexpr double kInitStd = 0.02;

inline void fill_normal(float* p, std::size_t n, double stddev, std::uint64_t& rng) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>(stddev * normal(rng));
}

// Carves consecutive regions out of one buffer; with a null base it only measures.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(std::size_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += n;
    return p;
  }
  // n bf16 values, starting on a 64-byte line of the buffer.
  std::uint16_t* take_bf16(std::size_t n) {
    constexpr std::size_t line = 64 / sizeof(float);
    used_ = (used_ + line - 1) / line * line;
    return reinterpret_cast<std::uint16_t*>(take(bf16_floats(n)));
  }
  std::size_t used() const noexcept { return used_; }

 private:
  float* base_;
  std::size_t used_ = 0;
};

// A tensor forward keeps for backward: in fp32, or as bf16 bits under Precision::bf16 (Note
// [bf16 compute]). Exactly one pointer is set.
struct Kept {
  float* f32 = nullptr;
  std::uint16_t* bf16 = nullptr;

  static Kept take(Carver& k, std::size_t n, bool bf16) {
    return bf16 ? Kept{nullptr, k.take_bf16(n)} : Kept{k.take(n), nullptr};
  }
  // Calls write(p) with the one pointer that is set (float* or std::uint16_t*): a Device op's
  // overload for that storage writes the tensor, rounding as it stores in bf16.
  template <class Write>
  void store(const Write& write) const {
    if (bf16)
      write(bf16);
    else
      write(f32);
  }
  MatOut output() const { return {f32, bf16}; }
  MatIn input() const { return {f32, bf16}; }
};

}  // namespace lockstep::detail
