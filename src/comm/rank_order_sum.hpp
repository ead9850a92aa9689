// The sum loop of the fused all-reduce (Note [Fused all-reduce] in shared_memory_comm.cpp),
// for every data plane that reads all ranks' contributions from memory: the communicator of one
// process, and the shared-memory window of processes on one node (Note [Shared-memory all-reduce]
// in src/comm/mpi/shared_window_all_reduce.hpp).
#pragma once

#include <span>

#include "lockstep/comm.hpp"

namespace lockstep::detail {

// For every element i of `slice`: the sum of in[0][i], in[1][i], ... in that order (so the bits
// depend on the number of ranks alone), divided by `divisor` when not 1, stored into out[q][i]
// for every q. Two inputs or more. An output may be an input: each chunk of the slice is read
// whole before it is written. AVX2 where the CPU has it (Note [Wide vectors for the sums]).
void sum_floats(std::span<float* const> in, std::span<float* const> out, ShardRange slice,
                int divisor);

}  // namespace lockstep::detail
