// The .state file of a checkpoint: TrainState and the optimiser's state vectors.
//
// Format, version 4. Little-endian; strings are a length then UTF-8 bytes, no terminator.
//
//   offset  size  field
//        0     9  magic "LSTPSTATE"
//        9     4  u32 version (4)
//       13     8  u64 P: payload bytes; the file is exactly 29 + P bytes
//       21     8  u64 FNV-1a 64 of bytes [0, 21) then of the payload: every byte but itself
//       29     P  payload:
//                   i64 step, u64 epoch, u64 batch_in_epoch, u64 epoch_start, i64 samples,
//                   u64 config_hash,
//                   i32 workers, u8 length + optimizer name ("sgd" | "adamw"),
//                   i64 optimizer_steps, u64 seed,
//                   u64 weights_checksum   (lockstep.checksum of the .safetensors beside it),
//                   u32 config key count, then per key (TrainState::config):
//                     u16 length + key, u32 length + value,
//                   u32 vector count, then per vector:
//                     u16 length + name, u64 element count n, n x f32
//
// The optimiser is stored by name so that reordering OptimizerKind cannot change its meaning.
//
// Older versions are still read. Version 3 has no epoch_start (read as 0); version 2 has no
// config keys either (it names the config by its hash alone); version 1 differs from 2 only in
// its checksum, of the payload alone (its header fields are each checked). A state of version 2 or later says that the weights beside it carry
// "lockstep.file_checksum" (Note [Whole-file checksum]).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "lockstep/checkpoint.hpp"

namespace lockstep::detail {

struct StateFile {
  TrainState state;
  std::vector<StateVector> optimizer_state;
  std::uint64_t weights_checksum = 0;
  std::uint32_t version = 0;  // 1 to 4, as read
};

// Throws std::invalid_argument for what read_state_file() would reject: a negative step,
// sample or optimiser step count, workers < 1, an unknown optimizer, a state vector name that
// is empty, repeated or longer than 65535 bytes, a config key that is empty or longer.
void check_state(const TrainState& state, std::span<const StateVector> optimizer_state);

// Crash-safe, as write_file_atomically(). Runs check_state() first.
void write_state_file(const std::filesystem::path& file, const TrainState& state,
                      std::span<const StateVector> optimizer_state, std::uint64_t weights_checksum);

// Throws InputError naming the file, the byte offset and the field for any malformed input.
StateFile read_state_file(const std::filesystem::path& file);

}  // namespace lockstep::detail
