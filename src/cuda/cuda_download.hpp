// The CUDA Download (Note [Downloads] in lockstep/device.hpp): device-to-host copies on a stream
// of their own, into pinned memory, ordered by two events.
//
//   start(copies):  mark the compute stream (readers_), make the download stream wait for the
//                   mark, queue the copies on it, record copied_.
//   fence():        the compute stream waits for copied_.
//   done(), wait(): copied_ has completed (polled; wait() through Device::wait_until).
// The stream is not the device's copy stream: the batches' uploads (CudaStagedBuffer) must not
// queue behind a snapshot's copies, and a GPU runs a transfer each way at once.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/handles.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cuda {

class CudaDownload final : public Download {
 public:
  // `device` owns `compute` and must outlive the download; its waits are the download's.
  CudaDownload(const Device& device, cudaStream_t compute);
  ~CudaDownload() override;
  CudaDownload(const CudaDownload&) = delete;
  CudaDownload& operator=(const CudaDownload&) = delete;

  void start(std::span<const Transfer> copies) override;
  void fence() override;
  bool done() override;
  void wait() override;

 private:
  const Device& device_;
  cudaStream_t compute_;
  Stream stream_;
  Event readers_;  // on the compute stream, at start(): after every kernel queued before it
  Event copied_;   // on stream_, after the last start()'s copies
};

// Pinned host memory for a Download, usable by every device (cudaHostAllocPortable), freed with
// cudaFreeHost when its last owner lets go.
HostMemory allocate_pinned(std::size_t bytes);

}  // namespace lockstep::cuda
