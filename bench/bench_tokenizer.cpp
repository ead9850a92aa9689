// Single-thread encode throughput of the GPT-2 tokenizer on a text file, in MB/s of text:
//   bench_tokenizer TOKENIZER TEXT [RUNS]
// cold: a fresh Tokenizer per run, so the pre-token cache starts empty (tiktoken has none);
// warm: the same text again through the same Tokenizer. Best of RUNS (5). One thread: encode()
// runs on the calling thread. bench/measure_tokenizer.sh runs it beside tiktoken.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "lockstep/tokenizer.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: bench_tokenizer TOKENIZER TEXT [RUNS]\n");
    return 2;
  }
  std::ifstream in(argv[2], std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const int runs = argc > 3 ? std::atoi(argv[3]) : 5;
  double cold = 1e30, warm = 1e30;
  std::size_t tokens = 0;
  for (int r = 0; r < runs; ++r) {
    const lockstep::Tokenizer tokenizer = lockstep::Tokenizer::load(argv[1]);
    auto start = std::chrono::steady_clock::now();
    tokens = tokenizer.encode(text).size();
    cold = std::min(cold, seconds_since(start));
    start = std::chrono::steady_clock::now();
    tokenizer.encode(text);
    warm = std::min(warm, seconds_since(start));
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  fmt::print("lockstep: {:.2f} MB/s cold cache, {:.2f} MB/s warm ({} tokens, best of {})\n",
             mb / cold, mb / warm, tokens, runs);
  return 0;
}
