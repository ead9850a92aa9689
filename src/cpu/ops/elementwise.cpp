// Elementwise kernels: fill, scale, add, the bias and its gradient, activations and SwiGLU. The
// activation math is common/elementwise_math.hpp, shared with the CUDA kernels
// (src/cuda/ops/elementwise.cu).
#include "cpu/cpu_device.hpp"

#include <string>
#include <type_traits>

#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {
namespace {

// Returns use(f, f') with the activation's per-element function and its derivative.
template <class Use>
void with_activation(Activation f, const char* op, const Use& use) {
  switch (f) {
    case Activation::relu:
      return use([](float v) { return detail::relu(v); },
                 [](float v) { return detail::relu_grad(v); });
    case Activation::tanh:
      return use([](float v) { return detail::tanh_act(v); },
                 [](float v) { return detail::tanh_grad(v); });
    case Activation::gelu:
      return use([](float v) { return detail::gelu(v); },
                 [](float v) { return detail::gelu_grad(v); });
  }
  throw std::invalid_argument(std::string(op) + ": unknown activation");
}

}  // namespace

// y = f(x) and dx = dy * f'(x), elementwise over n. X and Y are float, or std::uint16_t holding
// bf16: widened as read, rounded as written (detail::load_value, store_value); dx_bf16, when not
// null, gets dx rounded. dy[i] is read before dx[i] is written, so dx may alias dy.
// In place (y == x, dx == dy) the loops name one array rather than two that alias: GCC
// vectorises a loop over two arrays behind a runtime overlap check, which exact aliasing fails.
template <class X, class Y, class F>
void CpuDevice::map(const X* x, Y* y, std::size_t n, F f) {
  for_range(n, vectorized([x, y, f](std::size_t i0, std::size_t i1) {
    if constexpr (std::is_same_v<X, Y>)
      if (y == x) {
        for (std::size_t i = i0; i < i1; ++i)
          detail::store_value(&y[i], f(detail::load_value(y[i])));
        return;
      }
    for (std::size_t i = i0; i < i1; ++i) detail::store_value(&y[i], f(detail::load_value(x[i])));
  }));
}

template <class X, class F>
void CpuDevice::map_grad(const X* x, const float* dy, float* dx, std::uint16_t* dx_bf16,
                         std::size_t n, F fprime) {
  for_range(n, vectorized([x, dy, dx, dx_bf16, fprime](std::size_t i0, std::size_t i1) {
    if (dx == dy)
      for (std::size_t i = i0; i < i1; ++i) dx[i] *= fprime(detail::load_value(x[i]));
    else
      for (std::size_t i = i0; i < i1; ++i) dx[i] = dy[i] * fprime(detail::load_value(x[i]));
    if (dx_bf16)
      for (std::size_t i = i0; i < i1; ++i) dx_bf16[i] = detail::float_to_bf16(dx[i]);
  }));
}

// y (rows, cols) = x + bias (cols), Y float or bf16 (rounded), the bias B float or bf16
// (widened); in place when y == x.
template <class B, class Y>
void CpuDevice::add_bias_of(const float* x, const B* bias, Y* y, int rows, int cols) {
  const std::size_t nc = static_cast<std::size_t>(cols), nr = static_cast<std::size_t>(rows);
  const std::size_t block = rows_per_block(nc);
  for_blocks(blocks_of(nr, block), vectorized([=](std::size_t b) {
    for (std::size_t r = b * block; r < std::min(nr, (b + 1) * block); ++r) {
      const float* xr = x + r * nc;
      Y* yr = y + r * nc;
      if constexpr (std::is_same_v<Y, float>)
        if (yr == xr) {
          for (std::size_t c = 0; c < nc; ++c) yr[c] += detail::load_value(bias[c]);
          continue;
        }
      for (std::size_t c = 0; c < nc; ++c)
        detail::store_value(&yr[c], xr[c] + detail::load_value(bias[c]));
    }
  }));
}

void CpuDevice::fill(float* x, float value, std::size_t n) {
  for_range(n, [&](std::size_t i0, std::size_t i1) { std::fill(x + i0, x + i1, value); });
}

void CpuDevice::scale(float* x, float alpha, std::size_t n) {
  for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) x[i] *= alpha;
  }));
}

void CpuDevice::add(const float* a, const float* b, float* y, std::size_t n) {
  for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  }));
}

// Note [LoRA dropout] in src/model/lora.cpp: each element's keep from (key, i) alone, so the
// blocks for_range cuts do not matter.
void CpuDevice::dropout(const float* x, float* y, std::size_t n, std::uint64_t key, float p,
                        bool accumulate) {
  const std::uint32_t threshold = detail::dropout_threshold(p);
  const float scale = detail::dropout_scale(p);
  for_range(n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const float kept = detail::dropout_keeps(key, i, threshold) ? x[i] * scale : 0.0f;
      y[i] = accumulate ? y[i] + kept : kept;
    }
  });
}

// y (rows, cols) += bias (cols)
void CpuDevice::add_bias(float* y, const float* bias, int rows, int cols) {
  add_bias_of(y, bias, y, rows, cols);
}

// dbias (cols) += column sums of dy (rows, cols), G float or bf16 (widened). Each column is
// summed over the rows in order, in double; columns are split into fixed blocks.
template <class G>
void CpuDevice::bias_grad_of(float* dbias, const G* dy, int rows, int cols) {
  constexpr std::size_t kCols = 64;
  const std::size_t nc = static_cast<std::size_t>(cols), nr = static_cast<std::size_t>(rows);
  const auto columns = vectorized([=](std::size_t c0, std::size_t c1) {
    double acc[kCols];
    for (std::size_t c = c0; c < c1; ++c) acc[c - c0] = dbias[c];
    for (std::size_t r = 0; r < nr; ++r)
      for (std::size_t c = c0; c < c1; ++c) acc[c - c0] += detail::load_value(dy[r * nc + c]);
    for (std::size_t c = c0; c < c1; ++c) dbias[c] = static_cast<float>(acc[c - c0]);
  });
  if (nr * nc <= kGrain) {
    for (std::size_t c0 = 0; c0 < nc; c0 += kCols) columns(c0, std::min(nc, c0 + kCols));
    return;
  }
  for_blocks(blocks_of(nc, kCols),
             [&](std::size_t b) { columns(b * kCols, std::min(nc, (b + 1) * kCols)); });
}

void CpuDevice::activation_forward(Activation f, const float* x, float* y, std::size_t n) {
  with_activation(f, "activation_forward", [&](auto fn, auto) { map(x, y, n, fn); });
}

void CpuDevice::activation_backward(Activation f, const float* x, const float* dy, float* dx,
                                    std::size_t n) {
  with_activation(f, "activation_backward",
                  [&](auto, auto fprime) { map_grad(x, dy, dx, nullptr, n, fprime); });
}

// ---- bf16 storage: the fp32 ops above, widening bf16 as read and rounding as written ----

// y (rows, cols) = x + bias (cols), rounded
void CpuDevice::add_bias(const float* x, const std::uint16_t* bias, std::uint16_t* y, int rows,
                         int cols) {
  add_bias_of(x, bias, y, rows, cols);
}

void CpuDevice::bias_grad(float* dbias, const float* dy, int rows, int cols) {
  bias_grad_of(dbias, dy, rows, cols);
}

void CpuDevice::bias_grad(float* dbias, const std::uint16_t* dy, int rows, int cols) {
  bias_grad_of(dbias, dy, rows, cols);
}

void CpuDevice::activation_forward(Activation f, const std::uint16_t* x, std::uint16_t* y,
                                   std::size_t n) {
  with_activation(f, "activation_forward", [&](auto fn, auto) { map(x, y, n, fn); });
}

void CpuDevice::activation_backward(Activation f, const std::uint16_t* x, const float* dy,
                                    float* dx, std::uint16_t* dx_bf16, std::size_t n) {
  with_activation(f, "activation_backward",
                  [&](auto, auto fprime) { map_grad(x, dy, dx, dx_bf16, n, fprime); });
}

// ---- SwiGLU ----------------------------------------------------------------------------------
//
// Note [SwiGLU]
// ~~~~~~~~~~~~~
// A Llama-family MLP is down(silu(gate(x)) * up(x)). The gate and up maps read the same x, so
// their weights stack into one (2F, C) matrix and one product writes h (rows, 2F): gate in
// columns [0, F), up in [F, 2F) (Hugging Face keeps gate_proj and up_proj apart; loading
// stacks them). swiglu_forward reads both halves of a row once and writes y (rows, F) =
// silu(gate) * up; swiglu_backward reads them and dy once and writes dh in h's layout,
//   dgate = (dy * up) * silu'(gate),  dup = dy * silu(gate),
// the input gradient of the stacked product, which under bf16 it also rounds in the same pass
// (dh_bf16), as GELU's backward does. silu is x / (1 + e^-x) with exp_poly (Note [One exp for
// both backends]), no fused multiply-add: the CUDA kernels compute the same bits. Under bf16, h
// is kept in bf16 (the product's output) and y rounded (the down product's only input): each
// read widened and each result rounded once, bit for bit the fp32 op between from_bf16 and
// to_bf16 passes (Note [bf16 compute]).

// H: the storage of h and y (float, or std::uint16_t holding bf16).
template <class H>
void CpuDevice::swiglu_forward_of(const H* h, H* y, int rows, int F) {
  const std::size_t nf = static_cast<std::size_t>(F), nr = static_cast<std::size_t>(rows);
  for_rows(nr, 2 * nf, [=](std::size_t r) {
    const H* gate = h + r * 2 * nf;
    const H* up = gate + nf;
    H* yr = y + r * nf;
    for (std::size_t c = 0; c < nf; ++c)
      detail::store_value(&yr[c], detail::silu(detail::load_value(gate[c])) *
                                      detail::load_value(up[c]));
  });
}

template <class H>
void CpuDevice::swiglu_backward_of(const H* h, const float* dy, float* dh,
                                   std::uint16_t* dh_bf16, int rows, int F) {
  const std::size_t nf = static_cast<std::size_t>(F), nr = static_cast<std::size_t>(rows);
  for_rows(nr, 2 * nf, [=](std::size_t r) {
    const H* gate = h + r * 2 * nf;
    const H* up = gate + nf;
    const float* dyr = dy + r * nf;
    float* dgate = dh + r * 2 * nf;
    float* dup = dgate + nf;
    for (std::size_t c = 0; c < nf; ++c) {
      const float g = detail::load_value(gate[c]);
      dgate[c] = dyr[c] * detail::load_value(up[c]) * detail::silu_grad(g);
      dup[c] = dyr[c] * detail::silu(g);
    }
    if (dh_bf16)
      for (std::size_t c = 0; c < 2 * nf; ++c)
        dh_bf16[r * 2 * nf + c] = detail::float_to_bf16(dgate[c]);
  });
}

void CpuDevice::swiglu_forward(const float* h, float* y, int rows, int F) {
  swiglu_forward_of(h, y, rows, F);
}

void CpuDevice::swiglu_forward(const std::uint16_t* h, std::uint16_t* y, int rows, int F) {
  swiglu_forward_of(h, y, rows, F);
}

void CpuDevice::swiglu_backward(const float* h, const float* dy, float* dh, int rows, int F) {
  swiglu_backward_of(h, dy, dh, nullptr, rows, F);
}

void CpuDevice::swiglu_backward(const std::uint16_t* h, const float* dy, float* dh,
                                std::uint16_t* dh_bf16, int rows, int F) {
  swiglu_backward_of(h, dy, dh, dh_bf16, rows, F);
}

}  // namespace lockstep::cpu
