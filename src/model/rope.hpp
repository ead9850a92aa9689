// The tables of rotary position embeddings (Note [RoPE] in src/cpu/ops/rope.cpp): a head's
// inverse frequencies and the cos and sin of every position's angles, made once per run on the
// host, as transformers makes them, then uploaded for the rope ops (RopeTable).
//
//   RopeFrequencies f{.theta = 500000.0,
//                     .llama3 = Llama3Scaling{.factor = 32.0, .low_freq_factor = 1.0,
//                                             .high_freq_factor = 4.0,
//                                             .original_max_position_embeddings = 8192}};
//   RopeTables t = rope_tables(f, /*head_size=*/64, /*positions=*/2048);
//   // t.cos, t.sin: (2048, 32) each
#pragma once

#include <optional>
#include <vector>

#include "lockstep/model.hpp"

namespace lockstep::detail {

// rope_scaling {"rope_type": "llama3", ...} of a Hugging Face config (Llama 3.1 and later),
// as GptSpec carries it.
using lockstep::Llama3Scaling;

// rope_theta and, when set, the llama3 scaling of the frequencies.
struct RopeFrequencies {
  double theta = 10000.0;
  std::optional<Llama3Scaling> llama3{};
};

// inv_freq (head_size / 2) as transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters compute it in fp32 (Note [RoPE tables] in rope.cpp). head_size
// even, >= 2; std::invalid_argument otherwise, or for a theta or scaling that cannot be one.
std::vector<float> rope_inverse_frequencies(const RopeFrequencies& f, int head_size);

// cos and sin (positions, head_size / 2) of p * inv_freq[i], row p = position p.
struct RopeTables {
  std::vector<float> cos, sin;
  int positions = 0;
};
RopeTables rope_tables(const RopeFrequencies& f, int head_size, int positions);

}  // namespace lockstep::detail
