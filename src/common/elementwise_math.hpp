// Per-element math that the CPU and CUDA devices both compute: activations and their
// derivatives (SiLU among them), RoPE's rotation, the SGD and AdamW updates of one parameter,
// the step's clip factor and skip flag, a label error's key, and the replica hash's term.
// Compiled by the host compiler (src/cpu/ops/*.cpp, C++20) and by nvcc (src/cuda/ops/*.cu,
// C++17), so that the CPU reference and the kernels run the same formula and cannot drift apart.
// Plain C++17, no library calls that either side lacks.
//
// Note [One exp for both backends]: GELU's exp is exp_poly below on both backends, not the
// library's expf. On the CPU a library call would keep the loops from vectorising; on the GPU
// the polynomial costs a dozen multiply-adds in a kernel bound by memory. Both backends thus
// compute the same formula, and neither fuses its multiplies and adds, so they get the same bits
// (Note [Numerics of the CUDA kernels] in src/cuda/ops/common.cuh).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/host_device.hpp"
#include "common/random.hpp"

namespace lockstep::detail {

// ---- Activations: f(x) and f'(x) -----------------------------------------------------------

LOCKSTEP_HOST_DEVICE inline float relu(float x) { return x > 0.0f ? x : 0.0f; }
LOCKSTEP_HOST_DEVICE inline float relu_grad(float x) { return x > 0.0f ? 1.0f : 0.0f; }

LOCKSTEP_HOST_DEVICE inline float tanh_act(float x) { return std::tanh(x); }
LOCKSTEP_HOST_DEVICE inline float tanh_grad(float x) {
  const float t = std::tanh(x);
  return 1.0f - t * t;
}

// The float whose bits are `bits`.
LOCKSTEP_HOST_DEVICE inline float float_from_bits(std::int32_t bits) {
#ifdef __CUDA_ARCH__
  return __int_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// exp(x) without a library call (Cephes' expf): x = k ln2 + r with |r| <= ln2 / 2, e^r by a
// degree-6 polynomial, 2^k through the exponent bits. Within 8e-8 relative of exp (checked
// against std::exp in double over [-80, 80] in 1e-4 steps); the argument is clamped to
// [-87, 87] (e^-87 is still a normal float). See Note [One exp for both backends].
LOCKSTEP_HOST_DEVICE inline float exp_poly(float x) {
  x = x > 87.0f ? 87.0f : (x < -87.0f ? -87.0f : x);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float k = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return p * float_from_bits((static_cast<std::int32_t>(k) + 127) << 23);
}

// GELU needs 1 + tanh(u) and 1 - tanh(u)^2, which cancel badly where tanh(u) is near -1 or 1 if
// computed from tanh(u) itself. From e = exp(-2|u|) (tanh |u| = (1 - e) / (1 + e)) both come
// without cancellation: 1 + tanh u = 2 / (1 + e) for u >= 0 and 2e / (1 + e) below;
// 1 - tanh^2 u = 4e / (1 + e)^2.
struct TanhTerms {
  float one_plus;      // 1 + tanh(u)
  float one_minus_sq;  // 1 - tanh(u)^2
};
LOCKSTEP_HOST_DEVICE inline TanhTerms tanh_terms(float u) {
  const float e = exp_poly(u < 0.0f ? 2.0f * u : -2.0f * u);
  const float inv = 1.0f / (1.0f + e);
  return {(u < 0.0f ? 2.0f * e : 2.0f) * inv, 4.0f * e * inv * inv};
}

// GELU, the tanh approximation: 0.5 x (1 + tanh(c (x + a x^3))), and its derivative.
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

LOCKSTEP_HOST_DEVICE inline float gelu(float x) {
  return 0.5f * x * tanh_terms(kGeluC * (x + kGeluA * x * x * x)).one_plus;
}
LOCKSTEP_HOST_DEVICE inline float gelu_grad(float x) {
  const TanhTerms t = tanh_terms(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * t.one_plus + 0.5f * x * t.one_minus_sq * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
}

// SiLU (x sigmoid(x)), SwiGLU's gate (Note [SwiGLU] in src/cpu/ops/elementwise.cpp): x / (1 +
// e^-x) as PyTorch writes it, and its derivative s (1 + x (1 - s)) with s = sigmoid(x), as
// PyTorch's silu_backward. exp_poly's clamp keeps 1 + e^-x finite, so a large negative x gives
// a tiny silu, never NaN.
LOCKSTEP_HOST_DEVICE inline float silu(float x) { return x / (1.0f + exp_poly(-x)); }
LOCKSTEP_HOST_DEVICE inline float silu_grad(float x) {
  const float s = 1.0f / (1.0f + exp_poly(-x));
  return s * (1.0f + x * (1.0f - s));
}

// ---- Rotary embeddings (Note [RoPE] in src/cpu/ops/rope.cpp) -------------------------------

// The pair (x1, x2) of a head's columns i and i + D/2 rotated by the angle whose cos and sin
// are c and s: transformers' q * cos + rotate_half(q) * sin, with the same roundings (each
// product rounded, then the sum). Its inverse, backward's, is the rotation by -s.
struct RotatedPair {
  float first, second;
};
LOCKSTEP_HOST_DEVICE inline RotatedPair rope_rotate(float x1, float x2, float c, float s) {
  return {x1 * c - x2 * s, x2 * c + x1 * s};
}

// ---- Optimisers: the update of element i (PyTorch semantics, see device.hpp) ----------------

struct SgdScalars {
  float lr;
  float momentum;
  float weight_decay;
  bool nesterov;
};

// The optimiser step's scalars from the squared global gradient norm (Device::step_control):
// clipping scales the gradient by clip / (norm + 1e-6) when clip > 0 and the norm exceeds it;
// a norm that is not finite skips the update. grad_scale multiplies each gradient element in
// the updates below; by 1.0f that is exact, so an unclipped step has the plain update's bits.
struct StepScalars {
  double grad_norm;
  float clip_scale;
  std::int32_t skip;
};

LOCKSTEP_HOST_DEVICE inline StepScalars step_scalars(double norm_sq, double clip) {
  const double norm = std::sqrt(norm_sq);
  const float scale = clip > 0.0 && norm > clip ? static_cast<float>(clip / (norm + 1e-6)) : 1.0f;
  return {norm, scale, std::isfinite(norm) ? 0 : 1};
}

// a * b rounded on its own: nvcc would otherwise fuse it into a following add, where the CPU
// rounds the product first (the clip factor was once a separate scale kernel).
LOCKSTEP_HOST_DEVICE inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// g = grad * grad_scale + wd * p; buf = momentum * buf + g; g = nesterov ? g + momentum * buf :
// buf; p -= lr * g. momentum_buf is only read when momentum != 0 (it may be null otherwise).
LOCKSTEP_HOST_DEVICE inline void sgd_update(const SgdScalars& s, float grad_scale, float* params,
                                            const float* grads, float* momentum_buf,
                                            std::size_t i) {
  float g = mul_rn(grads[i], grad_scale);
  if (s.weight_decay != 0.0f) g += s.weight_decay * params[i];
  if (s.momentum != 0.0f) {
    const float buf = momentum_buf[i] = s.momentum * momentum_buf[i] + g;
    g = s.nesterov ? g + s.momentum * buf : buf;
  }
  params[i] -= s.lr * g;
}

// AdamW's per-step scalars, computed in double and rounded once to float.
struct AdamWScalars {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float eps;
  float decay;      // 1 - lr * weight_decay
};

// Step t >= 1.
inline AdamWScalars adamw_scalars(float beta1, float beta2, float eps, float weight_decay,
                                  float lr, std::int64_t t) {
  const double b1 = beta1, b2 = beta2, td = static_cast<double>(t);
  AdamWScalars s{};
  s.beta1 = beta1;
  s.beta2 = beta2;
  s.one_minus_beta1 = static_cast<float>(1.0 - b1);
  s.one_minus_beta2 = static_cast<float>(1.0 - b2);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, td)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, td)));
  s.eps = eps;
  s.decay = static_cast<float>(1.0 - double(lr) * weight_decay);
  return s;
}

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p = p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// g = grad * grad_scale.
LOCKSTEP_HOST_DEVICE inline void adamw_update(const AdamWScalars& s, float grad_scale,
                                              float* params, const float* grads, float* m,
                                              float* v, std::size_t i) {
  const float g = mul_rn(grads[i], grad_scale);
  const float mi = m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
  const float vi = v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
  params[i] = params[i] * s.decay - s.step_size * (mi / denom);
}

// ---- Label errors (LossStats::label_error) ------------------------------------------------

// Row `row` (0 <= row < 2^31 - 1) had label `label` outside the classes: a nonzero key, larger
// for lower rows, so the largest key over a step's rows names the lowest.
LOCKSTEP_HOST_DEVICE inline std::uint64_t label_error_key(int row, std::int32_t label) {
  return (static_cast<std::uint64_t>(0x7fffffff - row) << 32) | static_cast<std::uint32_t>(label);
}
inline int label_error_row(std::uint64_t key) {
  return 0x7fffffff - static_cast<int>(key >> 32);
}
inline std::int32_t label_error_label(std::uint64_t key) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(key & 0xffffffffu));
}

// ---- Replica hash --------------------------------------------------------------------------

// Element i's term of Device::hash, whose value must not depend on the backend: the hash is
// n + the sum of these terms mod 2^64, for the float bit patterns `bits`.
LOCKSTEP_HOST_DEVICE inline std::uint64_t hash_term(std::uint32_t bits, std::uint64_t i) {
  return mix64(bits ^ mix64(i));
}

// ---- Dropout (Note [LoRA dropout] in src/model/lora.cpp) -----------------------------------

// Element i of the mask keyed by `key` is kept when the top 24 bits of the i-th draw of a
// SplitMix64 stream seeded with `key` lie at or above dropout_threshold(p): kept with
// probability 1 - p to within 2^-25, a pure function of (key, i, p), so that a forward, its
// backward and a recompute see one mask, on either backend, whatever the launch's shape.
LOCKSTEP_HOST_DEVICE inline std::uint32_t dropout_threshold(float p) {
  return static_cast<std::uint32_t>(p * 16777216.0f + 0.5f);
}
LOCKSTEP_HOST_DEVICE inline bool dropout_keeps(std::uint64_t key, std::uint64_t i,
                                               std::uint32_t threshold) {
  std::uint64_t state = key + i * 0x9E3779B97F4A7C15ull;
  return static_cast<std::uint32_t>(splitmix64(state) >> 40) >= threshold;
}
// A kept element's factor, 1 / (1 - p) in float, as torch's dropout scales.
LOCKSTEP_HOST_DEVICE inline float dropout_scale(float p) { return 1.0f / (1.0f - p); }

}  // namespace lockstep::detail
