// Fuzzes read_safetensors(): the input is the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.hpp"
#include "lockstep/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lockstep::fuzz::ScratchFile scratch("weights.safetensors");
  const auto& file = scratch.write({reinterpret_cast<const char*>(data), size});
  try {
    lockstep::read_safetensors(file);
  } catch (const lockstep::InputError& e) {
    lockstep::fuzz::require_named(e, {file.string()});
  }
  return 0;
}
