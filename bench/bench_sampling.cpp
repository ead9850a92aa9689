// Sampling time per token with and without the key/value cache (Note [KV cache] in
// src/model/kv_cache.cpp), in one process, on the CPU:
//   bench_sampling [--family llama|gpt2] [--context T] [--tokens N] [--uncached N] [--threads K]
// llama (the default): SmolLM2-135M's shape (30 layers, d_model 576, 9 query heads on 3 kv
// heads, SwiGLU 1536, vocabulary 49152); gpt2: GPT-2 small's (12 layers, d_model 768, 12 heads,
// vocabulary 50257). Both with a context of T (512) and random weights (the time does not depend
// on them). The prompt fills the context but for the N (64) tokens drawn greedily after it, so
// the last draws see T tokens. Per token: the median time between two draws (the first one,
// which waits for the prompt, is the prefill). Without the cache every draw runs the whole
// window; it draws --uncached (4) tokens. Prints both, their ratio and the prefill.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/generate.hpp"
#include "lockstep/model.hpp"
#include "stats.hpp"

namespace {

struct Timing {
  double first_s = 0.0;     // from the call to the first token: the prompt's forward and a draw
  double per_token_s = 0.0; // the median between two draws after it
};

Timing time_generate(lockstep::Replica& replica, const std::vector<int>& prompt, int tokens,
                     bool cached) {
  std::vector<double> at;
  const double start = lockstep::bench::now_s();
  lockstep::generate(replica, prompt, {.tokens = tokens, .temperature = 0.0, .kv_cache = cached},
                     [&](int) { at.push_back(lockstep::bench::now_s()); });
  std::vector<double> gaps;
  for (std::size_t i = 1; i < at.size(); ++i) gaps.push_back(at[i] - at[i - 1]);
  return {at.empty() ? 0.0 : at[0] - start, lockstep::bench::median(gaps)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string family = "llama";
  int context = 512, tokens = 64, uncached = 4, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--family") family = argv[i + 1];
    else if (flag == "--context") context = std::atoi(argv[i + 1]);
    else if (flag == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (flag == "--uncached") uncached = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      fmt::print(stderr, "bench_sampling: unknown option {}\n", flag);
      return 2;
    }
  }
  lockstep::GptSpec spec;
  if (family == "llama") {
    spec = {.vocab_size = 49152, .context = context, .n_layer = 30, .n_head = 9, .d_model = 576,
            .norm = lockstep::NormKind::rmsnorm, .positions = lockstep::PositionKind::rope,
            .rope_theta = 100000.0, .mlp = lockstep::MlpKind::swiglu,
            .intermediate_size = 1536, .n_kv_head = 3, .qkv_bias = false, .proj_bias = false};
  } else if (family == "gpt2") {
    spec = {.vocab_size = 50257, .context = context, .n_layer = 12, .n_head = 12, .d_model = 768};
  } else {
    fmt::print(stderr, "bench_sampling: --family: expected llama or gpt2\n");
    return 2;
  }
  if (tokens < 2 || uncached < 2 || tokens >= context) {
    fmt::print(stderr, "bench_sampling: expected 2 <= --tokens < --context, --uncached >= 2\n");
    return 2;
  }
  const lockstep::Model model = lockstep::Model::gpt(spec);
  auto dev = lockstep::make_cpu_device(0, threads);
  lockstep::Replica replica(*dev, model, 1);
  replica.load_parameters(model.initial_parameters(1));
  std::vector<int> prompt(static_cast<std::size_t>(context - tokens));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>((i * 7919) % 1000);

  // Once each first: oneDNN makes its primitives for each shape on first use.
  time_generate(replica, prompt, 2, true);
  time_generate(replica, prompt, 2, false);
  const Timing with = time_generate(replica, prompt, tokens, true);
  std::vector<int> long_prompt = prompt;
  long_prompt.resize(static_cast<std::size_t>(context - uncached), 1);
  const Timing without = time_generate(replica, long_prompt, uncached, false);
  fmt::print("{} ({} parameters), context {}, {} CPU thread(s), greedy\n", family,
             model.param_count(), context, threads);
  fmt::print("  with the kv cache:    {:8.2f} ms per token (median of {}, positions {}-{}); "
             "prefill of {} tokens {:.0f} ms\n",
             1e3 * with.per_token_s, tokens - 1, context - tokens + 1, context - 1,
             context - tokens, 1e3 * with.first_s);
  fmt::print("  without (the window): {:8.2f} ms per token (median of {})\n",
             1e3 * without.per_token_s, uncached - 1);
  fmt::print("  speed-up per token:   {:.1f}x\n", without.per_token_s / with.per_token_s);
  return 0;
}
