// The name an InputError gives an option of a request, in the caller's spelling.
//
// Note [Requests]
// `lockstep sample` and `lockstep export` are library calls (sample() in lockstep/generate.hpp,
// export_checkpoint() in lockstep/checkpoint.hpp) that the CLI and the Python module both make,
// so that each checks its options once, with one message. A message names the option at fault
// as its caller spells it (OptionSpelling): the CLI asks for its flags ("--top-k: expected >= 0,
// got -2"), Python for its keyword arguments, which are the request's fields ("top_k: ...").
// The flag is the field with "--" before it and '-' for '_', as every flag of those commands is.
// What only a command line has (an unknown flag, a missing positional argument, a number that
// does not parse) stays in the CLI.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

#include "lockstep/checkpoint.hpp"

namespace lockstep::detail {

inline std::string option_name(OptionSpelling spelling, std::string_view field) {
  if (spelling == OptionSpelling::field) return std::string(field);
  std::string flag = "--" + std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

}  // namespace lockstep::detail
