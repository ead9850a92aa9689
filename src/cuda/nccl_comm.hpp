// NCCL communicators: one rank per GPU, all in this process.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep::cuda {

// One communicator per rank, rank r on GPU device_ids[r]; the ids must be distinct. Call on the
// host thread before the workers start; each worker then calls attach() with its CudaDevice.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<const int> device_ids);

}  // namespace lockstep::cuda
