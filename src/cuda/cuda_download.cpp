// The CUDA Download; the ordering it keeps is described in cuda_download.hpp.
#include "cuda/cuda_download.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "cuda/check.hpp"
#include "cuda/nvtx.hpp"
#include "cuda/stream_work.hpp"

namespace lockstep::cuda {

CudaDownload::CudaDownload(const Device& device, cudaStream_t compute)
    : device_(device), compute_(compute) {
  DeviceGuard guard(device_.id());
  stream_ = make_stream();
  name_stream(stream_.get(), fmt::format("cuda:{} download", device_.id()));
  readers_ = make_event();
  copied_ = make_event();
  CUDA_CHECK(cudaEventRecord(copied_.get(), stream_.get()));  // recorded once: done() before any
}

CudaDownload::~CudaDownload() {
  // Copies still queued read device memory and write host memory that others own: wait for
  // them, with our device current. After an abort with work still queued, keep everything.
  DeviceGuard guard(device_.id());
  if (!settle(stream_.get(), device_)) {
    (void)copied_.release();
    (void)readers_.release();
    (void)stream_.release();
    return;
  }
  copied_.reset();
  readers_.reset();
  stream_.reset();
}

void CudaDownload::start(std::span<const Transfer> copies) {
  CUDA_CHECK(cudaEventRecord(readers_.get(), compute_));
  CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), readers_.get(), 0));
  for (const Transfer& t : copies)
    if (t.bytes)
      CUDA_CHECK(cudaMemcpyAsync(t.host, t.device, t.bytes, cudaMemcpyDeviceToHost,
                                 stream_.get()));
  CUDA_CHECK(cudaEventRecord(copied_.get(), stream_.get()));
}

void CudaDownload::fence() { CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_.get(), 0)); }

bool CudaDownload::done() { return event_done(copied_.get()); }

void CudaDownload::wait() {
  const cudaEvent_t copied = copied_.get();
  device_.wait_until([copied] { return event_done(copied); });
}

HostMemory allocate_pinned(std::size_t bytes) {
  void* p = nullptr;
  if (const cudaError_t e = cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(fmt::format(
        "could not pin {:.1f} MiB of host memory for a download (cudaHostAlloc: {}); in-memory "
        "snapshots (trainer.snapshot_every) need two copies of the parameters and optimizer state",
        static_cast<double>(bytes) / (1 << 20), cudaGetErrorString(e)));
  }
  // A device lost since may fail the free: the memory is then the process's until it exits.
  return HostMemory(static_cast<std::byte*>(p), [](std::byte* q) { (void)cudaFreeHost(q); });
}

}  // namespace lockstep::cuda
