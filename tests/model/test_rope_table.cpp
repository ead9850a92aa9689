// The rotary tables (model/rope.hpp, Note [RoPE tables] in src/model/rope.cpp): a closed form,
// and bit patterns against tests/model/rope_reference.py, transformers' code transcribed and
// run by Debian's PyTorch, with and without the llama3 scaling.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../cli/cli_runner.hpp"
#include "../skip.hpp"
#include "model/rope.hpp"

using lockstep::detail::Llama3Scaling;
using lockstep::detail::RopeFrequencies;
using lockstep::detail::RopeTables;
using lockstep::detail::rope_inverse_frequencies;
using lockstep::detail::rope_tables;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Lines of hex fp32 bit patterns, as rope_reference.py prints them.
std::vector<std::vector<float>> parse_lines(const std::string& text) {
  std::vector<std::vector<float>> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<float> values;
    std::string word;
    while (words >> word) {
      const auto bits = static_cast<std::uint32_t>(std::stoul(word, nullptr, 16));
      float v;
      std::memcpy(&v, &bits, sizeof v);
      values.push_back(v);
    }
    lines.push_back(std::move(values));
  }
  return lines;
}

// Ulps between two finite floats of the same sign (or zeros).
std::int64_t ulps(float a, float b) {
  return std::abs(std::int64_t(bits_of(a) & 0x7FFFFFFF) - std::int64_t(bits_of(b) & 0x7FFFFFFF)) +
         ((bits_of(a) ^ bits_of(b)) >> 31 ? 1 : 0);
}

}  // namespace

TEST_CASE("rope tables: theta 10000 and 4 channels give inv_freq 1 and 1/100") {
  const RopeTables t = rope_tables({}, 4, 3);
  REQUIRE(t.cos.size() == 6);
  CHECK(rope_inverse_frequencies({}, 4) == std::vector<float>{1.0f, 1.0f / 100.0f});
  CHECK(t.cos[0] == 1.0f);
  CHECK(t.sin[1] == 0.0f);
  CHECK(t.cos[2] == static_cast<float>(std::cos(1.0)));
  CHECK(t.sin[5] == static_cast<float>(std::sin(double(2.0f * 0.01f))));
  CHECK_THROWS_AS(rope_inverse_frequencies({}, 3), std::invalid_argument);
  CHECK_THROWS_AS(rope_inverse_frequencies({.theta = 1.0, .llama3 = {}}, 4), std::invalid_argument);
  CHECK_THROWS_AS(rope_inverse_frequencies({.llama3 = Llama3Scaling{.high_freq_factor = 1.0}}, 4),
                  std::invalid_argument);
}

// Llama 3.2's scaling (factor 32, wavelengths split at 2048 and 8192) and 3.1's (factor 8, 128
// channels) put frequencies in all three bands; the short original context puts most of a small
// head's in the smoothed middle one. inv_freq must match PyTorch's to the ulp (its fp32 pow may
// round the other way), and so then must each angle; cos and sin within an ulp of PyTorch's
// (each side's fp32 cos and sin are within an ulp of the exact value).
TEST_CASE("rope tables match transformers' formulas run in PyTorch, llama3 scaling included") {
  if (lockstep::test::run_command("/usr/bin/python3 -c 'import torch'").code != 0)
    return lockstep::test::skip(lockstep::test::Skip::missing,
                                "/usr/bin/python3 cannot import torch (Debian: python3-torch)");
  struct Case {
    RopeFrequencies f;
    int head_size, positions;
  };
  const Case cases[] = {{{10000.0, {}}, 64, 200},
                        {{1000000.0, {}}, 64, 100},
                        {{500000.0, Llama3Scaling{32.0, 1.0, 4.0, 8192.0}}, 64, 300},
                        {{500000.0, Llama3Scaling{8.0, 1.0, 4.0, 8192.0}}, 128, 300},
                        {{10000.0, Llama3Scaling{4.0, 1.0, 4.0, 64.0}}, 16, 100}};
  for (const Case& c : cases) {
    CAPTURE(c.f.theta);
    CAPTURE(c.head_size);
    std::string args = fmt::format("{} {} {}", c.f.theta, c.head_size, c.positions);
    if (c.f.llama3)
      args += fmt::format(" {} {} {} {}", c.f.llama3->factor, c.f.llama3->low_freq_factor,
                          c.f.llama3->high_freq_factor,
                          c.f.llama3->original_max_position_embeddings);
    const auto r = lockstep::test::run_command("/usr/bin/python3 \"" LOCKSTEP_SOURCE_DIR
                                               "/tests/model/rope_reference.py\" " + args);
    REQUIRE_MESSAGE(r.code == 0, r.output);
    const auto want = parse_lines(r.output);
    REQUIRE(want.size() == 3);
    const std::vector<float> inv = rope_inverse_frequencies(c.f, c.head_size);
    const RopeTables got = rope_tables(c.f, c.head_size, c.positions);
    REQUIRE(want[0].size() == inv.size());
    REQUIRE(want[1].size() == got.cos.size());
    REQUIRE(want[2].size() == got.sin.size());
    int exact = 0;
    for (std::size_t i = 0; i < inv.size(); ++i) {
      CAPTURE(i);
      CHECK(ulps(inv[i], want[0][i]) <= 1);
      exact += inv[i] == want[0][i];
    }
    MESSAGE(exact << " of " << inv.size() << " frequencies have PyTorch's bits");
    const std::size_t half = inv.size();
    for (std::size_t k = 0; k < got.cos.size(); ++k) {
      const std::size_t p = k / half, i = k % half;
      if (inv[i] != want[0][i]) continue;  // another angle: the frequency check covers it
      if (ulps(got.cos[k], want[1][k]) > 1 || ulps(got.sin[k], want[2][k]) > 1) {
        FAIL_CHECK("position " << p << ", frequency " << i << ": cos " << got.cos[k] << " sin "
                               << got.sin[k] << ", PyTorch's " << want[1][k] << " "
                               << want[2][k]);
        break;
      }
    }
  }
}
