// The peer communicator: our own all-reduce between ranks of this process over device memory.
// It serves what NCCL cannot: several ranks on one GPU (device ids such as [0, 0, 0, 0]).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep::cuda {

// One communicator per rank, rank r on GPU device_ids[r]; ids may repeat. At most
// kMaxPeerRanks (kernels.hpp) ranks. Call on the host thread before the workers start; each
// worker then calls attach() with its CudaDevice.
std::vector<std::unique_ptr<Communicator>> make_peer_group(std::span<const int> device_ids);

}  // namespace lockstep::cuda
