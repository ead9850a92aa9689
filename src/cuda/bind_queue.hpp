// What a CUDA communicator takes from its worker's device: the compute stream of
// Device::queue(), once the queue is shown to be a GPU's, and the one the communicator was made
// for. Communicator::bind() calls it; no cast of the Device is needed.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "lockstep/device.hpp"

namespace lockstep::cuda {

// `who` names the communicator in messages ("NCCL communicator"); rank `rank` was created for
// GPU `device_id`.
inline cudaStream_t bound_stream(std::string_view who, int rank, int device_id,
                                 const DeviceQueue& queue) {
  if (queue.backend != "cuda" || !queue.cuda_stream)
    throw std::invalid_argument(fmt::format("{}: rank {} needs a CUDA device, got {}:{}", who,
                                            rank, queue.backend, queue.device_id));
  if (queue.device_id != device_id)
    throw std::invalid_argument(fmt::format("{}: rank {} was created for cuda:{}, attached to "
                                            "cuda:{}", who, rank, device_id, queue.device_id));
  return queue.cuda_stream;
}

}  // namespace lockstep::cuda
