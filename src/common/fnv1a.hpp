// FNV-1a 64 (Fowler, Noll, Vo): the checksum of checkpoint files and the config hash.
//
// Chosen over a faster hash because anyone can recompute it from the published constants in a
// few lines (tests/io/check_safetensors.py does). Feed bytes in pieces by passing the
// previous result as `hash`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::detail {

inline constexpr std::uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;

inline std::uint64_t fnv1a64(const void* data, std::size_t size,
                             std::uint64_t hash = kFnv1a64Basis) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace lockstep::detail
