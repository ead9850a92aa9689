// Token ids against a reference library's, with the first difference shown in context.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/tokenizer.hpp"

namespace lockstep::test {

inline std::string escaped(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7F ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return out;
}

// Passes when `ours` is `theirs` (the ids `reference` gave); otherwise says where they part, with
// the tokens around it.
inline void check_same_ids(const Tokenizer& t, const std::vector<TokenId>& ours,
                           const std::vector<TokenId>& theirs, const std::string& what,
                           std::string_view reference = "tiktoken") {
  std::size_t i = 0;
  while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
  if (i == ours.size() && i == theirs.size()) return;
  const auto context = [&](const std::vector<TokenId>& ids) {
    std::string s;
    for (std::size_t k = i >= 3 ? i - 3 : 0; k < std::min(ids.size(), i + 4); ++k)
      s += fmt::format("{}{}:'{}' ", k == i ? ">" : "", ids[k],
                       ids[k] < t.vocab_size() ? escaped(t.token_bytes(ids[k])) : "?");
    return s;
  };
  FAIL(what << ": " << ours.size() << " ids, " << reference << " " << theirs.size()
            << "; first difference at id " << i << "\n  ours: " << context(ours) << "\n  "
            << reference << ": " << context(theirs));
}

}  // namespace lockstep::test
