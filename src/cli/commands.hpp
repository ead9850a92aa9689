// The `lockstep` commands that live in files of their own (main.cpp dispatches to them).
#pragma once

#include <string_view>
#include <vector>

namespace lockstep::cli {

inline constexpr int kExitOk = 0, kExitFailure = 1, kExitBadInput = 2;

// lockstep tokenize --tokenizer DIR|FILE --out FILE [--eval-out FILE --eval-fraction F]
//                   [--format llmc|raw] INPUT...
int tokenize(const std::vector<std::string_view>& args);

}  // namespace lockstep::cli
