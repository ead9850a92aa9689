// The error of a token stream shorter than one window (context + 1 tokens), which the caller
// that knows where the stream came from can turn into advice (data.eval_path: re-tokenize).
#pragma once

#include <string>

#include "lockstep/error.hpp"

namespace lockstep::detail {

class TooFewTokens : public InputError {
 public:
  explicit TooFewTokens(const std::string& what) : InputError(what) {}
};

}  // namespace lockstep::detail
