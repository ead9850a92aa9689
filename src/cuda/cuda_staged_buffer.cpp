// The CUDA StagedBuffer; the ordering it keeps is described in cuda_staged_buffer.hpp.
#include "cuda/cuda_staged_buffer.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "cuda/check.hpp"

namespace lockstep::cuda {

CudaStagedBuffer::CudaStagedBuffer(int device_id, cudaStream_t compute, cudaStream_t copy,
                                   std::size_t bytes)
    : device_id_(device_id), compute_(compute), copy_(copy), bytes_(bytes) {
  DeviceGuard guard(device_id_);
  // At least one byte each, so the pointers are never null.
  memory_ = make_device_memory(std::max<std::size_t>(bytes, 1));
  host_ = make_pinned_memory(std::max<std::size_t>(bytes, 1));
  readers_done_ = make_event();
  copied_ = make_event();
  CUDA_CHECK(cudaEventRecord(copied_.get(), copy_));  // recorded once, so always waitable
}

CudaStagedBuffer::~CudaStagedBuffer() {
  // Kernels queued on the compute stream may still read the memory, and a transfer may still
  // read the pinned side: free both once they are done, with our device current.
  DeviceGuard guard(device_id_);
  (void)cudaEventSynchronize(copied_.get());
  (void)cudaStreamSynchronize(compute_);
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
  CUDA_CHECK(cudaEventSynchronize(copied_.get()));
  std::memcpy(host_.get(), host.data(), host.size());
  CUDA_CHECK(cudaEventRecord(readers_done_.get(), compute_));
  CUDA_CHECK(cudaStreamWaitEvent(copy_, readers_done_.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(memory_.get(), host_.get(), host.size(), cudaMemcpyHostToDevice,
                             copy_));
  CUDA_CHECK(cudaEventRecord(copied_.get(), copy_));
}

void CudaStagedBuffer::wait() { CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_.get(), 0)); }

}  // namespace lockstep::cuda
