// LoRA's target names (lockstep/model.hpp, model/lora_targets.hpp): apart from
// src/model/lora.cpp, so that the config checks (and the fuzz harness that links them,
// tests/fuzz/CMakeLists.txt) need nothing of the layers.
#include "model/lora_targets.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/model.hpp"

namespace lockstep {
namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string name(text.substr(start, comma - start));
    std::erase(name, ' ');
    out.push_back(std::move(name));
    start = comma + 1;
  }
  return out;
}

bool known_to(const std::vector<std::string>& known, const std::string& name) {
  return std::find(known.begin(), known.end(), name) != known.end();
}

}  // namespace

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<std::string> parse_lora_targets(std::string_view text) {
  const std::vector<std::string> names = split(text);
  const bool gpt2 = text != "all" && std::all_of(names.begin(), names.end(), [](const auto& n) {
    return n == "c_proj" || known_to(detail::gpt2_lora_target_names(), n);
  });
  return detail::parse_lora_targets(text, gpt2);
}

namespace detail {

const std::vector<std::string>& gpt2_lora_target_names() {
  static const std::vector<std::string> names = {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"};
  return names;
}

std::vector<std::string> parse_lora_targets(std::string_view text, bool gpt2) {
  const std::vector<std::string>& known = gpt2 ? gpt2_lora_target_names() : lora_target_names();
  if (text == "all") return known;
  std::vector<std::string> out;
  for (const std::string& name : split(text)) {
    // GPT-2's "c_proj": both, as PEFT's suffix match takes it.
    const std::vector<std::string> names =
        gpt2 && name == "c_proj" ? std::vector<std::string>{"attn.c_proj", "mlp.c_proj"}
                                 : std::vector<std::string>{name};
    if (!known_to(known, names.front()))
      throw std::invalid_argument(
          fmt::format("'{}' is not a projection{}: expected {}{} or all", name,
                      gpt2 ? " of GPT-2's" : "", fmt::join(known, ", "), gpt2 ? ", c_proj" : ""));
    for (const std::string& n : names) {
      if (known_to(out, n)) throw std::invalid_argument(fmt::format("'{}' is named twice", n));
      out.push_back(n);
    }
  }
  // In storage order, whatever order they were named in (PEFT writes a set).
  std::vector<std::string> ordered;
  for (const std::string& name : known)
    if (known_to(out, name)) ordered.push_back(name);
  return ordered;
}

}  // namespace detail
}  // namespace lockstep
