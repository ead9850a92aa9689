// What the parity tests with transformers (test_hf_parity.cpp, test_peft_parity.cpp) hand to
// their Python side: a fixed batch of token windows and raw arrays.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include <doctest/doctest.h>

namespace lockstep::test {

template <class T>
void write_raw(const std::filesystem::path& file, const std::vector<T>& v) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  REQUIRE(out.good());
}

// `batch` windows of context + 1 fixed tokens below `vocab` (the last of each is the target),
// and the model's inputs: each window's first `context` tokens as floats.
struct ParityBatch {
  std::vector<std::int32_t> tokens;
  std::vector<float> inputs;
};
inline ParityBatch parity_batch(int batch, int context, int vocab) {
  ParityBatch out;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t <= context; ++t) {
      out.tokens.push_back((b * 131 + t * 37 + t * t) % vocab);
      if (t < context) out.inputs.push_back(static_cast<float>(out.tokens.back()));
    }
  return out;
}

}  // namespace lockstep::test
