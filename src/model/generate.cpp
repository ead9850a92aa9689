// Autoregressive sampling from a GPT replica (see include/lockstep/generate.hpp).
#include "lockstep/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
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

namespace {

// The model's next-token logits for a sequence, one position per token with a key/value cache
// (Note [KV cache] in kv_cache.cpp), or the whole window per token without one (the reference).
// Both read the same window: the last `context` tokens.
class NextLogits {
 public:
  NextLogits(Replica& replica, bool cached)
      : replica_(replica), context_(replica.model().inputs()),
        stride_(replica.model().outputs() / context_),
        window_(static_cast<std::size_t>(context_), 0.0f),
        input_(replica.device(), window_.size()) {
    if (cached) cache_.emplace(replica.device(), replica.model());
  }

  // row (vocab) = the logits after the last token of `sequence`.
  void next(const std::vector<int>& sequence, std::span<float> row) {
    const int len = static_cast<int>(std::min<std::size_t>(sequence.size(), context_));
    const float* logits = nullptr;
    if (!cache_) {
      // Left-aligned: positions after the window are padding, which causal attention keeps
      // from affecting the ones before.
      std::fill(window_.begin(), window_.end(), 0.0f);
      fill_window(sequence, len);
      input_.upload(window_);
      logits = replica_.forward(input_.data(), 1) + std::size_t(len - 1) * stride_;
    } else if (cached_ > 0 && cached_ + 1 == int(sequence.size()) && cached_ < context_) {
      // One new token at position cached_.
      window_[0] = static_cast<float>(sequence.back());
      input_.upload(std::span<const float>(window_.data(), 1));
      logits = replica_.decode(input_.data(), cached_, 1, *cache_);
      ++cached_;
    } else {
      // The prompt, or a window that slid past the context: every position again.
      fill_window(sequence, len);
      input_.upload(std::span<const float>(window_.data(), std::size_t(len)));
      logits = replica_.decode(input_.data(), 0, len, *cache_) + std::size_t(len - 1) * stride_;
      cached_ = len;
    }
    replica_.device().copy_to_host(row.data(), logits, row.size() * sizeof(float));
  }

 private:
  void fill_window(const std::vector<int>& sequence, int len) {
    for (int p = 0; p < len; ++p)
      window_[p] = static_cast<float>(sequence[sequence.size() - len + p]);
  }

  Replica& replica_;
  int context_, stride_;
  std::vector<float> window_;
  DeviceArray<float> input_;
  std::optional<KvCache> cache_;
  int cached_ = 0;  // positions in the cache: the sequence's first ones, or its last window
};

}  // namespace

std::vector<int> generate(Replica& replica, std::span<const int> prompt,
                          const SamplingOptions& options, const std::function<void(int)>& on_token) {
  const Model& model = replica.model();
  const int context = model.inputs();
  if (context < 1 || model.outputs() % context != 0)
    throw std::invalid_argument("generate: the model is not a language model (outputs are not "
                                "context x vocab)");
  // Each position's row of logits has `stride` entries, the first `vocab` real: the padding
  // (Note [Padded vocabulary] in lm_head.cpp) is never sampled nor a valid prompt token.
  const int stride = model.outputs() / context;
  const int vocab = stride - model.layers().back()->vocab_padding();
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty");
  for (int t : prompt)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument(
          fmt::format("generate: prompt token {} is outside the vocabulary [0, {})", t, vocab));
  if (options.tokens < 0)
    throw std::invalid_argument(fmt::format("generate: tokens {} < 0", options.tokens));

  NextLogits logits(replica, options.kv_cache);
  std::vector<int> sequence(prompt.begin(), prompt.end());
  std::vector<int> generated;
  std::vector<float> row(vocab);
  std::uint64_t rng = options.seed;
  for (int i = 0; i < options.tokens; ++i) {
    logits.next(sequence, row);
    const int next = sample_token(row, options.temperature, options.top_k, rng);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
        options.stop_tokens.end())
      break;
    sequence.push_back(next);
    generated.push_back(next);
    if (on_token) on_token(next);
  }
  return generated;
}

}  // namespace lockstep
