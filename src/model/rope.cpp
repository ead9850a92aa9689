#include "model/rope.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

namespace lockstep::detail {

// Note [RoPE tables]
// ~~~~~~~~~~~~~~~~~~
// transformers computes a head's inverse frequencies in fp32 tensors (modeling_rope_utils.py):
//   inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))
// and for rope_type llama3 (_compute_llama3_parameters) rescales them by wavelength:
//   wavelen = 2 * math.pi / inv_freq
//   inv_freq_llama = where(wavelen > old_context_len / low_freq_factor, inv_freq / factor,
//                          inv_freq)
//   smooth_factor = (old_context_len / wavelen - low_freq_factor)
//                   / (high_freq_factor - low_freq_factor)
//   smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
//   inv_freq_llama = where(medium, smoothed, inv_freq_llama), medium: neither
//                    wavelen < old_context_len / high_freq_factor nor
//                    wavelen > old_context_len / low_freq_factor.
// Each step here is the same fp32 operation: a Python number meeting an fp32 tensor is rounded
// to fp32 first, and `number / tensor` is PyTorch's reciprocal(tensor) * number (Tensor.
// __rtruediv__), so two roundings. The power is std::pow in double, rounded once: PyTorch's
// fp32 pow is within an ulp of it. The rotary forward then takes freqs = inv_freq * position in
// fp32 (one rounding) and its cos and sin in fp32; here cos and sin of that fp32 angle in
// double, rounded once, within an ulp of PyTorch's. tests/model/test_rope_table.cpp compares
// the tables with a transcription of transformers' code in PyTorch (tests/model/
// rope_reference.py), since the transformers release the interop tests pin (4.40.2) predates
// the llama3 scaling.

namespace {

float as_float(double x) { return static_cast<float>(x); }

// `number / x` as PyTorch computes it for a Python number and an fp32 tensor.
float number_over(double number, float x) { return (1.0f / x) * as_float(number); }

}  // namespace

std::vector<float> rope_inverse_frequencies(const RopeFrequencies& f, int head_size) {
  if (head_size < 2 || head_size % 2 != 0)
    throw std::invalid_argument(
        fmt::format("rotary embeddings: head_size {} is not an even number >= 2", head_size));
  if (!(f.theta > 1.0))
    throw std::invalid_argument(
        fmt::format("rotary embeddings: rope_theta {} is not > 1", f.theta));
  const int half = head_size / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_size);
    inv[i] = 1.0f / as_float(std::pow(double(as_float(f.theta)), double(exponent)));
  }
  if (!f.llama3) return inv;
  const Llama3Scaling& s = *f.llama3;
  if (!(s.factor > 0.0) || !(s.high_freq_factor > s.low_freq_factor) ||
      !(s.low_freq_factor > 0.0) || !(s.original_max_position_embeddings > 0.0))
    throw std::invalid_argument(fmt::format(
        "rotary embeddings: llama3 scaling needs factor > 0 and high_freq_factor > "
        "low_freq_factor > 0 and original_max_position_embeddings > 0 (got {}, {}, {}, {})",
        s.factor, s.high_freq_factor, s.low_freq_factor, s.original_max_position_embeddings));
  const double old = s.original_max_position_embeddings;
  const float low_wavelen = as_float(old / s.low_freq_factor);
  const float high_wavelen = as_float(old / s.high_freq_factor);
  const float factor = as_float(s.factor), low = as_float(s.low_freq_factor);
  const float span = as_float(s.high_freq_factor - s.low_freq_factor);
  for (float& v : inv) {
    const float wavelen = number_over(2.0 * std::numbers::pi, v);
    const float scaled = wavelen > low_wavelen ? v / factor : v;
    const float smooth = (number_over(old, wavelen) - low) / span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    v = medium ? smoothed : scaled;
  }
  return inv;
}

RopeTables rope_tables(const RopeFrequencies& f, int head_size, int positions) {
  if (positions < 0)
    throw std::invalid_argument(fmt::format("rotary embeddings: {} positions", positions));
  const std::vector<float> inv = rope_inverse_frequencies(f, head_size);
  RopeTables t{{}, {}, positions};
  t.cos.reserve(std::size_t(positions) * inv.size());
  t.sin.reserve(t.cos.capacity());
  for (int p = 0; p < positions; ++p)
    for (float v : inv) {
      const double angle = static_cast<float>(p) * v;  // fp32, as transformers' freqs
      t.cos.push_back(as_float(std::cos(angle)));
      t.sin.push_back(as_float(std::sin(angle)));
    }
  return t;
}

}  // namespace lockstep::detail
