// Fuzzes load_tokens() and load_text(): the input is the file, read as a token file in each
// format and as text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.hpp"
#include "lockstep/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lockstep::fuzz::ScratchFile scratch("input.tokens");
  const auto& file = scratch.write({reinterpret_cast<const char*>(data), size});
  const std::string name = file.string();
  using lockstep::TokenFormat;
  for (const TokenFormat format : {TokenFormat::automatic, TokenFormat::llmc, TokenFormat::raw}) {
    try {
      lockstep::load_tokens(file, format, /*context=*/4, /*vocab_size=*/50257);
    } catch (const lockstep::InputError& e) {
      lockstep::fuzz::require_named(e, {name});
    }
  }
  try {
    lockstep::load_text(file, /*context=*/4);
  } catch (const lockstep::InputError& e) {
    lockstep::fuzz::require_named(e, {name});
  }
  return 0;
}
