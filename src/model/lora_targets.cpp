// LoRA's target names (lockstep/model.hpp): apart from src/model/lora.cpp, so that the config
// checks (and the fuzz harness that links them, tests/fuzz/CMakeLists.txt) need nothing of the
// layers.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/model.hpp"

namespace lockstep {

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<std::string> parse_lora_targets(std::string_view text) {
  if (text == "all") return lora_target_names();
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string name(text.substr(start, comma - start));
    std::erase(name, ' ');
    const auto& known = lora_target_names();
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw std::invalid_argument(fmt::format("'{}' is not a projection: expected {} or all",
                                              name, fmt::join(known, ", ")));
    if (std::find(out.begin(), out.end(), name) != out.end())
      throw std::invalid_argument(fmt::format("'{}' is named twice", name));
    out.push_back(std::move(name));
    start = comma + 1;
  }
  // In storage order, whatever order they were named in (PEFT writes a set).
  std::vector<std::string> ordered;
  for (const std::string& name : lora_target_names())
    if (std::find(out.begin(), out.end(), name) != out.end()) ordered.push_back(name);
  return ordered;
}

}  // namespace lockstep
