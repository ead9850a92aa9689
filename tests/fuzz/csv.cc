// Fuzzes load_csv(): the input is the file, loaded with the label column last, first and out
// of range, with and without a header line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_input.hpp"
#include "lockstep/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lockstep::fuzz::ScratchFile scratch("input.csv");
  const auto& file = scratch.write({reinterpret_cast<const char*>(data), size});
  const std::string name = file.string();
  struct Settings {
    int label_column;
    bool header;
  };
  for (const Settings s : {Settings{-1, false}, Settings{0, true}, Settings{-3, false},
                           Settings{1000, false}}) {
    try {
      lockstep::load_csv(file, s.label_column, s.header);
    } catch (const lockstep::InputError& e) {
      lockstep::fuzz::require_named(e, {name});
    }
  }
  return 0;
}
