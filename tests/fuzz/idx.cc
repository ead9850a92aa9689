// Fuzzes load_idx(). The input is split into the two files at the last labels magic number
// (00 00 08 01) after byte 0: an images file followed by a labels file. Without one, the whole
// input serves as both, so a seed of either kind exercises both parsers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_input.hpp"
#include "lockstep/dataset.hpp"

namespace {

constexpr std::string_view kLabelsMagic("\x00\x00\x08\x01", 4);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lockstep::fuzz::ScratchFile images_scratch("images.idx");
  static const lockstep::fuzz::ScratchFile labels_scratch("labels.idx");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t split = input.rfind(kLabelsMagic);
  const bool two_parts = split != std::string_view::npos && split > 0;
  const auto& images = images_scratch.write(two_parts ? input.substr(0, split) : input);
  const auto& labels = labels_scratch.write(two_parts ? input.substr(split) : input);
  try {
    lockstep::load_idx(images, labels);
  } catch (const lockstep::InputError& e) {
    lockstep::fuzz::require_named(e, {images.string(), labels.string()});
  }
  return 0;
}
