// Fuzzes the YAML config loader: parse_config() on the input, with the overrides the input
// carries. Each line "#set KEY=VALUE" (a comment to YAML) is also passed as an override, so a
// seed file means the same to lockstep train and here, overrides aside.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_input.hpp"
#include "lockstep/config.hpp"

namespace {

constexpr std::string_view kSource = "fuzz.yaml";
constexpr std::string_view kSetPrefix = "#set ";
constexpr std::size_t kMaxOverrides = 8;

std::vector<std::string> overrides_in(std::string_view text) {
  std::vector<std::string> overrides;
  while (!text.empty() && overrides.size() < kMaxOverrides) {
    const std::size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    if (line.starts_with(kSetPrefix)) overrides.emplace_back(line.substr(kSetPrefix.size()));
    if (eol == std::string_view::npos) break;
    text.remove_prefix(eol + 1);
  }
  return overrides;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> overrides = overrides_in(text);
  try {
    lockstep::parse_config(text, kSource);
  } catch (const lockstep::InputError& e) {
    lockstep::fuzz::require_named(e, {kSource});
  }
  if (overrides.empty()) return 0;
  try {
    lockstep::parse_config(text, kSource, overrides);
  } catch (const lockstep::InputError& e) {
    lockstep::fuzz::require_named(e, {kSource, "--set "});
  }
  return 0;
}
