// Fuzzes the reader of checkpoint .state files (src/io/state_file.hpp). Each input is read
// as it is, then with the header's payload size and checksum made to match the payload, so
// that mutations reach the payload's fields instead of stopping at the checksum.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/fnv1a.hpp"
#include "fuzz_input.hpp"
#include "io/state_file.hpp"

namespace {

constexpr std::size_t kSizeAt = 13, kChecksumAt = 21, kHeaderBytes = 29;  // see state_file.hpp

void read_state(const lockstep::fuzz::ScratchFile& scratch, std::string_view bytes) {
  const auto& file = scratch.write(bytes);
  try {
    lockstep::detail::read_state_file(file);
  } catch (const lockstep::InputError& e) {
    lockstep::fuzz::require_named(e, {file.string()});
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lockstep::fuzz::ScratchFile scratch("checkpoint.state");
  std::string bytes(reinterpret_cast<const char*>(data), size);
  read_state(scratch, bytes);
  if (bytes.size() < kHeaderBytes) return 0;
  const std::uint64_t payload_size = bytes.size() - kHeaderBytes;
  const std::uint64_t checksum =
      lockstep::detail::fnv1a64(bytes.data() + kHeaderBytes, payload_size);
  std::memcpy(bytes.data() + kSizeAt, &payload_size, sizeof payload_size);
  std::memcpy(bytes.data() + kChecksumAt, &checksum, sizeof checksum);
  read_state(scratch, bytes);
  return 0;
}
