// Single-thread encode throughput of a tokenizer on a text file, in MB/s of text:
//   bench_tokenizer TOKENIZER TEXT [RUNS] [FAMILY]
// TOKENIZER as `lockstep tokenize --tokenizer` takes it; FAMILY (llama3, qwen2, gpt2) for a
// rank file, as --tokenizer-family.
// cold: a fresh Tokenizer per run, so the pre-token cache starts empty (tiktoken has none);
// warm: the same text again through the same Tokenizer. Best of RUNS (5). One thread: encode()
// runs on the calling thread. bench/measure_tokenizer.sh runs it beside tiktoken.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "lockstep/tokenizer.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: bench_tokenizer TOKENIZER TEXT [RUNS] [FAMILY]\n");
    return 2;
  }
  const auto family = argc > 4 ? lockstep::parse_tokenizer_family(argv[4])
                               : std::optional(lockstep::TokenizerFamily::automatic);
  if (!family) {
    fmt::print(stderr, "bench_tokenizer: FAMILY: expected llama3, qwen2 or gpt2\n");
    return 2;
  }
  std::ifstream in(argv[2], std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const int runs = argc > 3 ? std::atoi(argv[3]) : 5;
  double cold = 1e30, warm = 1e30, load = 1e30;
  std::size_t tokens = 0;
  for (int r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    const lockstep::Tokenizer tokenizer = lockstep::Tokenizer::load(argv[1], *family);
    load = std::min(load, seconds_since(start));
    start = std::chrono::steady_clock::now();
    tokens = tokenizer.encode(text).size();
    cold = std::min(cold, seconds_since(start));
    start = std::chrono::steady_clock::now();
    tokenizer.encode(text);
    warm = std::min(warm, seconds_since(start));
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  fmt::print("lockstep: {:.2f} MB/s cold cache, {:.2f} MB/s warm ({} tokens, best of {}; load "
             "{:.3f} s)\n", mb / cold, mb / warm, tokens, runs, load);
  return 0;
}
