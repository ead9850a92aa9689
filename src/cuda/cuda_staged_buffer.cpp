// The CUDA StagedBuffer; the ordering it keeps is described in cuda_staged_buffer.hpp.
#include "cuda/cuda_staged_buffer.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "cuda/check.hpp"
#include "cuda/stream_work.hpp"

namespace lockstep::cuda {

CudaStagedBuffer::CudaStagedBuffer(const Device& device, cudaStream_t compute, cudaStream_t copy,
                                   std::size_t bytes)
    : device_(device), compute_(compute), copy_(copy), bytes_(bytes) {
  DeviceGuard guard(device_.id());
  // At least one byte each, so the pointers are never null.
  memory_ = make_device_memory(std::max<std::size_t>(bytes, 1));
  host_ = make_pinned_memory(std::max<std::size_t>(bytes, 1));
  readers_done_ = make_event();
  copied_ = make_event();
  CUDA_CHECK(cudaEventRecord(copied_.get(), copy_));  // recorded once, so always waitable
}

CudaStagedBuffer::~CudaStagedBuffer() {
  // Kernels queued on the compute stream may still read the memory, and a transfer may still
  // read the pinned side: free both once they are done, with our device current. After an
  // abort with work still queued, both are kept instead.
  DeviceGuard guard(device_.id());
  if (!settle(copy_, device_) || !settle(compute_, device_)) {
    (void)host_.release();
    (void)memory_.release();
    return;
  }
  copied_.reset();
  readers_done_.reset();
  host_.reset();
  memory_.reset();
}

void CudaStagedBuffer::stage(std::span<const std::byte> host) {
  if (host.size() > bytes_)
    throw std::invalid_argument(fmt::format("StagedBuffer::stage: {} bytes into a buffer of {}",
                                            host.size(), bytes_));
  if (host.empty()) return;
  // The pinned side is free once the previous transfer is done.
  const cudaEvent_t copied = copied_.get();
  device_.wait_until([copied] { return event_done(copied); });
  std::memcpy(host_.get(), host.data(), host.size());
  CUDA_CHECK(cudaEventRecord(readers_done_.get(), compute_));
  CUDA_CHECK(cudaStreamWaitEvent(copy_, readers_done_.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(memory_.get(), host_.get(), host.size(), cudaMemcpyHostToDevice,
                             copy_));
  CUDA_CHECK(cudaEventRecord(copied_.get(), copy_));
}

void CudaStagedBuffer::wait() { CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_.get(), 0)); }

}  // namespace lockstep::cuda
