// Autoregressive sampling from a GPT replica (see include/lockstep/generate.hpp).
#include "lockstep/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "common/random.hpp"

namespace lockstep {

int sample_token(std::span<const float> logits, double temperature, int top_k,
                 std::uint64_t& rng_state) {
  if (logits.empty()) throw std::invalid_argument("sample_token: no logits");
  if (!(temperature >= 0.0))
    throw std::invalid_argument(fmt::format("sample_token: temperature {} < 0", temperature));
  const int vocab = static_cast<int>(logits.size());
  if (temperature == 0.0)
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // The top_k largest, ties broken by the lower id so the draw is reproducible.
  std::vector<int> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  const auto larger = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), larger);
  ids.resize(k);
  std::vector<double> weights(k);
  const double top = logits[ids[0]];
  for (int i = 0; i < k; ++i) weights[i] = std::exp((logits[ids[i]] - top) / temperature);
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  double u = detail::uniform01(rng_state) * total;
  for (int i = 0; i < k; ++i) {
    if (u < weights[i]) return ids[i];
    u -= weights[i];
  }
  return ids[k - 1];  // rounding left u just above the total
}

std::vector<int> generate(Replica& replica, std::span<const int> prompt,
                          const SamplingOptions& options, const std::function<void(int)>& on_token) {
  const Model& model = replica.model();
  const int context = model.inputs();
  if (context < 1 || model.outputs() % context != 0)
    throw std::invalid_argument("generate: the model is not a language model (outputs are not "
                                "context x vocab)");
  // Each position's row of logits has `stride` entries, the first `vocab` real: the padding
  // (Note [Padded vocabulary] in gpt.cpp) is never sampled nor a valid prompt token.
  const int stride = model.outputs() / context;
  const int vocab = stride - model.layers().back()->vocab_padding();
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty");
  for (int t : prompt)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument(
          fmt::format("generate: prompt token {} is outside the vocabulary [0, {})", t, vocab));
  if (options.tokens < 0)
    throw std::invalid_argument(fmt::format("generate: tokens {} < 0", options.tokens));

  Device& dev = replica.device();
  std::vector<int> sequence(prompt.begin(), prompt.end());
  std::vector<int> generated;
  std::vector<float> window(static_cast<std::size_t>(context), 0.0f), row(vocab);
  DeviceArray<float> input(dev, window.size());
  std::uint64_t rng = options.seed;
  for (int i = 0; i < options.tokens; ++i) {
    const std::size_t len = std::min<std::size_t>(sequence.size(), context);
    std::fill(window.begin(), window.end(), 0.0f);
    for (std::size_t p = 0; p < len; ++p)
      window[p] = static_cast<float>(sequence[sequence.size() - len + p]);
    input.upload(window);
    const float* logits = replica.forward(input.data(), 1);
    dev.copy_to_host(row.data(), logits + (len - 1) * static_cast<std::size_t>(stride),
                     row.size() * sizeof(float));
    const int next = sample_token(row, options.temperature, options.top_k, rng);
    sequence.push_back(next);
    generated.push_back(next);
    if (on_token) on_token(next);
  }
  return generated;
}

}  // namespace lockstep
