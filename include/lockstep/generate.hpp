// Text generation with a trained language model (Model::gpt), one token at a time.
//
//   lockstep::Replica replica(device, model, /*max_batch=*/1);
//   replica.load_parameters(checkpoint.params);
//   std::vector<int> out = lockstep::generate(replica, prompt, {.tokens = 200, .top_k = 40},
//                                             [](int token) { std::putchar(token); });
//
// Each step runs the model on the last `context` tokens (left-aligned; positions after them are
// padding, which causal attention keeps from affecting the ones before), takes the logits at the
// last real position, divides them by the temperature, keeps the top_k largest, and draws the
// next token from their softmax with a generator seeded by `seed`: the same seed, weights and
// prompt give the same text. Temperature 0 is greedy (argmax).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "lockstep/export.hpp"
#include "lockstep/model.hpp"

namespace lockstep {

struct LOCKSTEP_API SamplingOptions {
  int tokens = 100;          // how many to generate
  double temperature = 1.0;  // >= 0; 0 picks the most likely token
  int top_k = 0;             // 0: the whole vocabulary
  std::uint64_t seed = 0;
};

// Returns the generated tokens (without the prompt); on_token sees each as it is drawn. The
// prompt must be non-empty with every token in [0, vocab), and `replica` a GPT's replica
// (inputs() = context, outputs() = context * (vocab + the LM head's vocab_padding())):
// std::invalid_argument otherwise. The padding is never drawn.
LOCKSTEP_API std::vector<int> generate(Replica& replica, std::span<const int> prompt,
                                       const SamplingOptions& options,
                                       const std::function<void(int)>& on_token = {});

// The next token from one row of logits (vocab entries), as generate() draws it; rng_state
// advances. Exposed for tests.
LOCKSTEP_API int sample_token(std::span<const float> logits, double temperature, int top_k,
                              std::uint64_t& rng_state);

}  // namespace lockstep
