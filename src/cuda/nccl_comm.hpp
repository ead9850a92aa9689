// NCCL communicators: one rank per GPU, in this process or across the processes of a job.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep::cuda {

// One communicator per rank, rank r on GPU device_ids[r]; the ids must be distinct. Call on the
// host thread before the workers start; each worker then calls attach() with its CudaDevice.
// With `processes` (more than one), every process calls it together and the group spans them:
// local rank r of process p is rank p x device_ids.size() + r (see Note [NCCL across processes]).
std::vector<std::unique_ptr<Communicator>> make_nccl_group(
    std::span<const int> device_ids, std::shared_ptr<ProcessGroup> processes = nullptr);

}  // namespace lockstep::cuda
