// float <-> bf16 (src/common/bf16.hpp): closed-form cases at every edge of Note [Rounding to
// bf16], then a million floats against PyTorch's conversion (tests/common/bf16_torch.py), bit
// for bit. Skips the PyTorch half when torch can't be imported (LOCKSTEP_PYTHON names the
// interpreter; default /usr/bin/python3).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "../skip.hpp"
#include "common/bf16.hpp"
#include "common/random.hpp"

namespace {

using lockstep::detail::bf16_to_float;
using lockstep::detail::bits_of_float;
using lockstep::detail::float_of_bits;
using lockstep::detail::float_to_bf16;

std::uint16_t bf16_of_bits(std::uint32_t bits) { return float_to_bf16(float_of_bits(bits)); }

bool is_nan_bf16(std::uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }

std::string python_interpreter() {
  if (const char* p = std::getenv("LOCKSTEP_PYTHON")) return p;
  return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

// n float bit patterns: uniform over all 2^32 (so subnormals, infinities and NaNs turn up), a
// quarter of them made exact ties (low half 0x8000), and the special values at the front.
std::vector<float> test_floats(std::size_t n) {
  const std::uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u,
                                    0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu,
                                    0x00000001u, 0x00008000u, 0x00018000u, 0x807F8000u,
                                    0x7F7F8000u, 0x7F7F7FFFu, 0x3F808000u, 0x3F818000u};
  std::vector<float> x;
  for (std::uint32_t s : specials) x.push_back(float_of_bits(s));
  std::uint64_t state = 16;
  while (x.size() < n) {
    auto bits = static_cast<std::uint32_t>(lockstep::detail::splitmix64(state));
    if (x.size() % 4 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;
    x.push_back(float_of_bits(bits));
  }
  return x;
}

}  // namespace

TEST_CASE("bf16: rounding to nearest even, closed form") {
  CHECK(bf16_of_bits(0x3F800000u) == 0x3F80);  // 1.0
  CHECK(bf16_of_bits(0x3F807FFFu) == 0x3F80);  // below the half: down
  CHECK(bf16_of_bits(0x3F808001u) == 0x3F81);  // above the half: up
  CHECK(bf16_of_bits(0x3F808000u) == 0x3F80);  // tie, kept bit even: stays
  CHECK(bf16_of_bits(0x3F818000u) == 0x3F82);  // tie, kept bit odd: up to even
  CHECK(bf16_of_bits(0xBF818000u) == 0xBF82);  // the sign is kept
  CHECK(bf16_of_bits(0x3FFF8000u) == 0x4000);  // the carry steps into the next binade
  // The largest finite bf16 is 0x7F7F; from its upper half on, floats round to infinity.
  CHECK(bf16_of_bits(0x7F7F7FFFu) == 0x7F7F);
  CHECK(bf16_of_bits(0x7F7F8000u) == 0x7F80);
  CHECK(bf16_of_bits(0xFF7FFFFFu) == 0xFF80);
  CHECK(bf16_of_bits(0x7F800000u) == 0x7F80);  // +inf
  CHECK(bf16_of_bits(0xFF800000u) == 0xFF80);  // -inf
  CHECK(bf16_of_bits(0x80000000u) == 0x8000);  // -0
  // Subnormals round like any other float.
  CHECK(bf16_of_bits(0x00000001u) == 0x0000);
  CHECK(bf16_of_bits(0x00008000u) == 0x0000);  // tie to even zero
  CHECK(bf16_of_bits(0x00018000u) == 0x0002);
  CHECK(bf16_of_bits(0x00008001u) == 0x0001);
  CHECK(bf16_of_bits(0x007FFFFFu) == 0x0080);  // the largest subnormal: up to the smallest normal
  // Every NaN, whatever its sign and payload, even one whose payload would carry into the
  // exponent, becomes the quiet NaN.
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFFFFFFFu})
    CHECK(bf16_of_bits(nan) == lockstep::detail::kBf16QuietNan);
}

TEST_CASE("bf16: every bf16 converts to float and back unchanged") {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float x = bf16_to_float(b);
    REQUIRE(bits_of_float(x) == h << 16);
    if (!is_nan_bf16(b)) REQUIRE(float_to_bf16(x) == b);
  }
}

TEST_CASE("bf16: a million floats round as PyTorch rounds them, bit for bit") {
  const std::string python = python_interpreter();
  if (lockstep::test::run_command(python + " -c 'import torch, numpy'").code != 0) {
    lockstep::test::skip(lockstep::test::Skip::missing,
                         python + " cannot import torch and numpy (Debian: python3-torch)");
    return;
  }
  const std::vector<float> x = test_floats(1'000'000);
  const lockstep::test::TempDir dir;
  const std::filesystem::path in = dir.path() / "x.f32", out = dir.path() / "torch.bf16";
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
    REQUIRE(f.good());
  }
  const std::string script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/common/bf16_torch.py";
  const auto run = lockstep::test::run_command(fmt::format("{} {} {} {}", python, script,
                                                           in.string(), out.string()));
  REQUIRE_MESSAGE(run.code == 0, run.output);
  std::vector<std::uint16_t> torch(x.size() + 16);
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(torch.data()), static_cast<std::streamsize>(torch.size() * 2));
  const auto got = static_cast<std::size_t>(f.gcount()) / 2;
  REQUIRE(got > x.size());

  std::size_t nans = 0, ties = 0, subnormals = 0, mismatches = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::uint32_t bits = bits_of_float(x[i]);
    const std::uint16_t ours = float_to_bf16(x[i]);
    if (x[i] != x[i]) {
      // PyTorch's bulk copy writes NaN as 0xFFFF, its scalar path as 0x7FC0, as we do (below).
      ++nans;
      mismatches += !(ours == lockstep::detail::kBf16QuietNan && is_nan_bf16(torch[i]));
      continue;
    }
    ties += (bits & 0xFFFFu) == 0x8000u;
    subnormals += (bits & 0x7F800000u) == 0 && (bits & 0x007FFFFFu) != 0;
    if (ours != torch[i] && mismatches++ < 5)
      MESSAGE(fmt::format("float {:#010x}: ours {:#06x}, torch {:#06x}", bits, ours, torch[i]));
  }
  CHECK(mismatches == 0);
  // The sample covers every case: about 1/256 of random bit patterns are NaN, 1/256 subnormal.
  CHECK(nans > 1000);
  CHECK(ties > 200'000);
  CHECK(subnormals > 1000);
  // PyTorch's scalar conversion of single NaNs agrees with ours exactly.
  REQUIRE(got == x.size() + 16);
  for (std::size_t i = x.size(); i < got; ++i) CHECK(torch[i] == lockstep::detail::kBf16QuietNan);
}
