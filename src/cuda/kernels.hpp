// Launchers for the CUDA backend's kernels, one file per op family under src/cuda/ops (named in
// each section below; src/cpu/ops has the CPU reference under the same names).
//
// Each launcher enqueues its kernel on `stream`, returns without waiting, and checks the launch
// (throws CudaError). Empty inputs launch nothing. Pointers are device memory of the stream's
// device unless said otherwise. Shapes are (rows, cols), row-major, as in device.hpp.
//
// Plain C++17 and CUDA runtime types only: included by nvcc (.cu) and by the C++20 host
// compiler (.cpp) alike, so nothing from include/lockstep (which needs C++20) appears here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/elementwise_math.hpp"

namespace lockstep::cuda {

// Threads per block of every kernel, and the fixed grid of the two-pass reductions: a fixed
// shape makes reductions sum in the same order on every GPU. 1024 blocks of 256 threads, four
// loads each in flight, keep about 4 MB in flight: enough to stream an H100/H200's memory.
constexpr int kThreads = 256;
constexpr int kReduceBlocks = 1024;

// Mirrors lockstep::Activation.
enum class ActivationKind : int { relu, gelu, tanh };

// ---- bf16 conversions (convert.cu) --------------------------------------------------------

// y[0..n) = x rounded to bf16 (common/bf16.hpp); from: widened back, exactly.
void launch_to_bf16(cudaStream_t stream, const float* x, std::uint16_t* y, std::size_t n);
void launch_from_bf16(cudaStream_t stream, const std::uint16_t* x, float* y, std::size_t n);

// ---- Elementwise (elementwise.cu) ---------------------------------------------------------

// x[0..n) = value
void launch_fill(cudaStream_t stream, float* x, float value, std::size_t n);
// x[0..n) *= alpha
void launch_scale(cudaStream_t stream, float* x, float alpha, std::size_t n);
// y (rows, cols) += bias (cols)
void launch_add_bias(cudaStream_t stream, float* y, const float* bias, int rows, int cols);
// y = f(x); dx = dy * f'(x)
void launch_activation_forward(cudaStream_t stream, ActivationKind f, const float* x, float* y,
                               std::size_t n);
void launch_activation_backward(cudaStream_t stream, ActivationKind f, const float* x,
                                const float* dy, float* dx, std::size_t n);
// bf16 storage, computed in fp32 (ElementwiseOps in device.hpp): y = x + bias rounded; y = f(x)
// with x, y bf16; dx = dy * f'(x) with x bf16, and dx rounded into dx_bf16 when not null. The
// rounded y's bias is bf16, as a bf16 output's bias epilogue reads it.
void launch_add_bias_bf16(cudaStream_t stream, const float* x, const std::uint16_t* bias,
                          std::uint16_t* y, int rows, int cols);
void launch_activation_forward_bf16(cudaStream_t stream, ActivationKind f,
                                    const std::uint16_t* x, std::uint16_t* y, std::size_t n);
void launch_activation_backward_bf16(cudaStream_t stream, ActivationKind f,
                                     const std::uint16_t* x, const float* dy, float* dx,
                                     std::uint16_t* dx_bf16, std::size_t n);
// SwiGLU (Note [SwiGLU] in src/cpu/ops/elementwise.cpp): h (rows, 2F) gate then up, y (rows, F)
// = silu(gate) * up; backward dh (rows, 2F) from dy (rows, F), rounded into dh_bf16 too when
// not null. fp32, or h and y bf16.
void launch_swiglu_forward(cudaStream_t stream, const float* h, float* y, int rows, int F);
void launch_swiglu_forward_bf16(cudaStream_t stream, const std::uint16_t* h, std::uint16_t* y,
                                int rows, int F);
void launch_swiglu_backward(cudaStream_t stream, const float* h, const float* dy, float* dh,
                            int rows, int F);
void launch_swiglu_backward_bf16(cudaStream_t stream, const std::uint16_t* h, const float* dy,
                                 float* dh, std::uint16_t* dh_bf16, int rows, int F);
// y = a + b; y may alias a or b.
void launch_add(cudaStream_t stream, const float* a, const float* b, float* y, std::size_t n);
// Device::dropout: y[i] (+)= x[i] / (1 - p) where dropout_keeps(key, i) (Note [LoRA dropout]).
void launch_dropout(cudaStream_t stream, const float* x, float* y, std::size_t n,
                    std::uint64_t key, float p, bool accumulate);
// dbias (cols) += column sums of dy (rows, cols), in double, in parallel over the rows in an
// order fixed by the shape: deterministic, and equal to the CPU device's rows-in-order sum up to
// double roundings (the floats are the same or neighbours; elementwise.cu says more).
void launch_bias_grad(cudaStream_t stream, float* dbias, const float* dy, int rows, int cols);
// The same with dy bf16, widened as read (a fused GELU backward's rounded gradient).
void launch_bias_grad_bf16(cudaStream_t stream, float* dbias, const std::uint16_t* dy, int rows,
                           int cols);

// ---- Softmax (softmax.cu) ------------------------------------------------------------------

// lockstep::LossStats and lockstep::StepControl (device.hpp), field for field: the device
// records the kernels write (cuda_device.cpp checks that the layouts agree).
struct LossAccumulator {
  double loss_sum;                  // summed over the rows
  long long correct;                // rows whose argmax equals the label
  unsigned long long label_error;   // detail::label_error_key of the lowest bad row, or 0
};
struct StepControlValues {
  double grad_norm;
  float clip_scale;
  int skip;
};

// logits (rows, classes), labels (rows), dlogits (rows, classes) or null. Adds the rows' loss
// and correct count to *stats. The labels are checked first: a label outside [0, classes) goes
// to stats->label_error (as of row first_row + r of the caller's batch), and then dlogits is left
// unwritten and nothing is added. exp in float, once per logit. Scratch: row_loss holds `rows`
// elements, row_correct `rows + 1` (the last: the call's first bad row).
void launch_softmax_cross_entropy(cudaStream_t stream, const float* logits,
                                  const std::int32_t* labels, int rows, int classes,
                                  float* dlogits, float grad_scale, double* row_loss,
                                  int* row_correct, LossAccumulator* stats, int first_row);
// The same with dlogits (not null) rounded to bf16 as written.
void launch_softmax_cross_entropy_bf16(cudaStream_t stream, const float* logits,
                                       const std::int32_t* labels, int rows, int classes,
                                       std::uint16_t* dlogits, float grad_scale,
                                       double* row_loss, int* row_correct,
                                       LossAccumulator* stats, int first_row);

// The fused classifier: the same with bf16 logits, one read of each row and one write of its
// bf16 gradient (dlogits, or null; it may alias logits). Note [Fused classifier] in
// src/cpu/ops/softmax.cpp.
void launch_fused_classifier(cudaStream_t stream, const std::uint16_t* logits,
                             const std::int32_t* labels, int rows, int classes,
                             std::uint16_t* dlogits, float grad_scale, double* row_loss,
                             int* row_correct, LossAccumulator* stats, int first_row);

// `count` (T, T) matrices, one warp per row. p may alias s; ds may alias dp.
void launch_causal_softmax_forward(cudaStream_t stream, const float* s, float* p, int count,
                                   int T, float scale);
void launch_causal_softmax_backward(cudaStream_t stream, const float* p, const float* dp,
                                    float* ds, int count, int T, float scale);
// `count` (rows, cols) matrices of the newest rows of sequences of cols positions
// (LayerOps::causal_softmax_tail_forward).
void launch_causal_softmax_tail_forward(cudaStream_t stream, const float* s, float* p, int count,
                                        int rows, int cols, float scale);
// Packed sequences: s[b][h][i][j] = -inf for j < i - positions[b][i] (LayerOps::mask_packed_scores).
void launch_mask_packed_scores(cudaStream_t stream, float* s, const std::int32_t* positions,
                               int batch, int heads, int T);
// Packed sequences under cuDNN's attention (Note [cuDNN packed mask]): bias (B, 1, T, T) bf16,
// bias[b][i][j] = 0 for i - positions[b][i] <= j <= i, -inf elsewhere.
void launch_packed_attention_bias(cudaStream_t stream, std::uint16_t* bias,
                                  const std::int32_t* positions, int batch, int T);
// bf16 storage (LayerOps in device.hpp): p rounded; backward reads p in bf16, writes ds rounded.
void launch_causal_softmax_forward_bf16(cudaStream_t stream, const float* s, std::uint16_t* p,
                                        int count, int T, float scale);
void launch_causal_softmax_backward_bf16(cudaStream_t stream, const std::uint16_t* p,
                                         const float* dp, std::uint16_t* ds, int count, int T,
                                         float scale);

// ---- Reductions (reduce.cu) ---------------------------------------------------------------

// *result = sum of x[i]^2 in double. partials: kReduceBlocks doubles of scratch.
void launch_sum_squares(cudaStream_t stream, const float* x, std::size_t n, double* partials,
                        double* result);

// sums[g] = sum of x[i]^2 in double over grain g = [g grain, min(n, (g + 1) grain)): one block
// per grain, so each grain's sum depends only on its elements. n > 0.
void launch_sum_squares_grains(cudaStream_t stream, const float* x, std::size_t n,
                               std::size_t grain, double* sums);

// *control = detail::step_scalars(sum of grain_sums[0..count) in order, clip): one thread adds
// the sums in the CPU's order, so the norm has the CPU's bits.
void launch_step_control(cudaStream_t stream, const double* grain_sums, std::size_t count,
                         double clip, StepControlValues* control);

// *result = sum over i of detail::hash_term(bits(x[i]), i) mod 2^64 (the caller adds n).
void launch_hash(cudaStream_t stream, const float* x, std::size_t n,
                 unsigned long long* result);

// ---- Optimisers (optimizer.cu) ------------------------------------------------------------

// Both read *control when it is not null: the gradient is grads * control->clip_scale, and a
// nonzero control->skip leaves everything unchanged (OptimizerOps in device.hpp). params_bf16,
// when not null, receives each updated parameter rounded to bf16 in the same pass.
// SGD, PyTorch semantics (see device.hpp). momentum_buf may be null when momentum == 0.
void launch_sgd_step(cudaStream_t stream, float lr, float momentum, float weight_decay,
                     bool nesterov, float* params, const float* grads, float* momentum_buf,
                     std::size_t n, const StepControlValues* control,
                     std::uint16_t* params_bf16);

// AdamW's per-step scalars: detail::adamw_scalars() computes them on the host.
using AdamWScalars = detail::AdamWScalars;
void launch_adamw_step(cudaStream_t stream, const AdamWScalars& s, float* params,
                       const float* grads, float* m, float* v, std::size_t n,
                       const StepControlValues* control, std::uint16_t* params_bf16);

// ---- Embedding (embedding.cu); shapes and semantics as in device.hpp ---------------------

// ids (batch, T) as floats, wte (V, C), wpe (>= T, C): out (batch, T, C) = wte[ids] + wpe[p],
// p = t, or positions[b, t] when positions is set (packed sequences).
void launch_embedding_forward(cudaStream_t stream, const float* ids, const float* wte,
                              const float* wpe, float* out, int batch, int T, int C,
                              const std::int32_t* positions);
// The same from bf16 tables, widened, the sum in fp32 (wpe null: out = wte[ids] widened).
void launch_embedding_forward(cudaStream_t stream, const float* ids, const std::uint16_t* wte,
                              const std::uint16_t* wpe, float* out, int batch, int T, int C,
                              const std::int32_t* positions);
// dwte[ids[b, t]] += dout[b, t]; dwpe[p] += dout[b, t] (p as forward's). Deterministic, and
// the CPU's float additions in the CPU's order: the rows are sorted by token (stable), then each
// token's rows added in order; packed positions likewise, sorted by position after the tokens.
// `scratch` holds at least embedding_backward_scratch_bytes(batch, T) bytes (device memory;
// scratch_bytes is its size) and is in use until the kernels are done.
std::size_t embedding_backward_scratch_bytes(int batch, int T);
void launch_embedding_backward(cudaStream_t stream, const float* ids, const float* dout,
                               float* dwte, float* dwpe, int batch, int T, int C, void* scratch,
                               std::size_t scratch_bytes, const std::int32_t* positions);

// ---- LayerNorm (layernorm.cu) --------------------------------------------------------------

// x = a, or a + b stored into sum when b is not null (the residual LayerNorm); y (rows, C),
// weight, bias (C), mean, rstd (rows). One warp per row.
void launch_layernorm_forward(cudaStream_t stream, const float* a, const float* b, float* sum,
                              const float* weight, const float* bias, float* y, float* mean,
                              float* rstd, int rows, int C);
// The same with y rounded to bf16 (LayerOps in device.hpp).
void launch_layernorm_forward_bf16(cudaStream_t stream, const float* a, const float* b,
                                   float* sum, const float* weight, const float* bias,
                                   std::uint16_t* y, float* mean, float* rstd, int rows, int C);
// dx (rows, C) = dresidual (0 when null) + d/dx (one warp per row; dx may alias dresidual),
// rounded into
// dx_bf16 too when not null; dweight, dbias (C) += their gradients, through per-chunk partials
// in `scratch` (layernorm_backward_scratch_bytes(rows, C) bytes of device memory) and a second
// pass: deterministic.
std::size_t layernorm_backward_scratch_bytes(int rows, int C);
void launch_layernorm_backward(cudaStream_t stream, const float* x, const float* weight,
                               const float* mean, const float* rstd, const float* dy,
                               const float* dresidual, float* dx, std::uint16_t* dx_bf16,
                               float* dweight, float* dbias, int rows, int C, void* scratch);

// RMSNorm (Note [RMSNorm] in src/cpu/ops/layernorm.cpp), the residual add fused as above: x = a,
// or a + b stored into sum when b is not null; y (rows, C) = x * rstd * weight (C), rstd (rows).
// Backward: dx = dresidual (0 when null) + d/dx, rounded into dx_bf16 too when not null;
// dweight += its gradient through `scratch` (layernorm_backward_scratch_bytes(rows, C) bytes).
void launch_rmsnorm_forward(cudaStream_t stream, const float* a, const float* b, float* sum,
                            const float* weight, float* y, float* rstd, int rows, int C,
                            float eps);
void launch_rmsnorm_forward_bf16(cudaStream_t stream, const float* a, const float* b, float* sum,
                                 const float* weight, std::uint16_t* y, float* rstd, int rows,
                                 int C, float eps);
void launch_rmsnorm_backward(cudaStream_t stream, const float* x, const float* weight,
                             const float* rstd, const float* dy, const float* dresidual,
                             float* dx, std::uint16_t* dx_bf16, float* dweight, int rows, int C,
                             void* scratch);

// ---- Rotary embeddings (rope.cu) -----------------------------------------------------------

// In place on the first heads + kv_heads heads (q's and k's) of each of `rows` rows of qkv
// (rows, (heads + 2 kv_heads) head_size); row r at position `position` + r % T of the tables
// cos, sin (positions, head_size / 2), or at positions[r] when that is not null (packed
// sequences). Note [RoPE] in src/cpu/ops/rope.cpp. Backward rotates back, and rounds the whole
// dqkv into dqkv_bf16 too when that is not null.
void launch_rope_forward(cudaStream_t stream, float* qkv, const float* cos, const float* sin,
                         int rows, int T, int position, const std::int32_t* positions, int heads,
                         int kv_heads, int head_size);
void launch_rope_forward_bf16(cudaStream_t stream, std::uint16_t* qkv, const float* cos,
                              const float* sin, int rows, int T, int position,
                              const std::int32_t* positions, int heads, int kv_heads,
                              int head_size);
void launch_rope_backward(cudaStream_t stream, float* dqkv, const float* cos, const float* sin,
                          int rows, int T, int position, const std::int32_t* positions, int heads,
                          int kv_heads, int head_size, std::uint16_t* dqkv_bf16);

// ---- Peer all-reduce (peer_reduce.cu) -----------------------------------------------------

constexpr int kMaxPeerRanks = 64;
// One slice of every rank's buffer, readable from the stream's device (same device, peer
// access, or a local staging copy).
struct PeerSlices {
  const float* src[kMaxPeerRanks];
};
// out[i] = (src[0][i] + src[1][i] + ... + src[ranks-1][i]) in rank order, in float, then
// times 1/ranks if `average`: the same arithmetic as the CPU shared-memory all-reduce.
// out may alias one of the sources.
void launch_peer_reduce(cudaStream_t stream, const PeerSlices& slices, int ranks, float* out,
                        std::size_t n, bool average);

}  // namespace lockstep::cuda
