// The CUDA StagedBuffer: device memory with its own pinned host side, filled on the device's
// copy stream so the transfer overlaps the kernels on the compute stream.
//
//   stage(host):  wait for this buffer's previous transfer (its pinned side is then free), copy
//                 `host` into the pinned side, mark the compute stream (readers_done_), and queue
//                 on the copy stream: wait for that mark, then the transfer, then record copied_.
//   wait():       the compute stream waits for copied_.
// The mark makes the transfer start only after every kernel queued before stage(), among them
// every reader of the buffer's previous contents: a batch is never overwritten under a kernel.
// Neither side ever blocks the host on the compute stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "cuda/handles.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cuda {

class CudaStagedBuffer final : public StagedBuffer {
 public:
  // The streams belong to `device`, which must outlive the buffer; its waits (Note [Abortable
  // waits] in lockstep/device.hpp) are the buffer's.
  CudaStagedBuffer(const Device& device, cudaStream_t compute, cudaStream_t copy,
                   std::size_t bytes);
  ~CudaStagedBuffer() override;
  CudaStagedBuffer(const CudaStagedBuffer&) = delete;
  CudaStagedBuffer& operator=(const CudaStagedBuffer&) = delete;

  std::size_t bytes() const noexcept override { return bytes_; }
  void stage(std::span<const std::byte> host) override;
  void wait() override;

 private:
  void* device_pointer() noexcept override { return memory_.get(); }

  const Device& device_;
  cudaStream_t compute_;
  cudaStream_t copy_;
  std::size_t bytes_;
  DeviceMemory memory_;
  PinnedMemory host_;
  Event readers_done_;  // on the compute stream, at stage(): after the previous contents' readers
  Event copied_;        // on the copy stream, after the last transfer
};

}  // namespace lockstep::cuda
