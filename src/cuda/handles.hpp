// RAII owners for CUDA streams, events, memory, cuBLAS handles and cuBLASLt descriptors.
// Move-only; destructors never throw and ignore the status of the destroy call (there is nobody
// left to tell).
//
//   cuda::Stream s = cuda::make_stream();
//   cuda::DeviceMemory buf = cuda::make_device_memory(bytes);
//   kernel<<<grid, block, 0, s.get()>>>(static_cast<float*>(buf.get()));
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "cuda/check.hpp"

namespace lockstep::cuda {

template <class T, class Destroy>
class Owner {
 public:
  Owner() = default;
  explicit Owner(T handle) noexcept : handle_(handle) {}
  Owner(Owner&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  Owner& operator=(Owner&& other) noexcept {
    Owner(std::move(other)).swap(*this);
    return *this;
  }
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;
  ~Owner() {
    if (handle_) Destroy{}(handle_);
  }

  T get() const noexcept { return handle_; }
  // Destroys the handle now, if any.
  void reset() noexcept { Owner().swap(*this); }
  // Gives up ownership: the caller destroys the handle.
  T release() noexcept { return std::exchange(handle_, T{}); }
  explicit operator bool() const noexcept { return handle_ != T{}; }

 private:
  void swap(Owner& other) noexcept { std::swap(handle_, other.handle_); }
  T handle_{};
};

struct DestroyStream {
  void operator()(cudaStream_t s) const noexcept { (void)cudaStreamDestroy(s); }
};
struct DestroyEvent {
  void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
};
struct FreeDevice {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
struct FreePinned {
  void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
};
struct DestroyCublas {
  void operator()(cublasHandle_t h) const noexcept { (void)cublasDestroy(h); }
};

struct DestroyCublasLt {
  void operator()(cublasLtHandle_t h) const noexcept { (void)cublasLtDestroy(h); }
};
struct DestroyLtMatmulDesc {
  void operator()(cublasLtMatmulDesc_t d) const noexcept { (void)cublasLtMatmulDescDestroy(d); }
};
struct DestroyLtLayout {
  void operator()(cublasLtMatrixLayout_t l) const noexcept { (void)cublasLtMatrixLayoutDestroy(l); }
};
struct DestroyLtPreference {
  void operator()(cublasLtMatmulPreference_t p) const noexcept {
    (void)cublasLtMatmulPreferenceDestroy(p);
  }
};

using Stream = Owner<cudaStream_t, DestroyStream>;
using Event = Owner<cudaEvent_t, DestroyEvent>;
using DeviceMemory = Owner<void*, FreeDevice>;
using PinnedMemory = Owner<void*, FreePinned>;
using CublasHandle = Owner<cublasHandle_t, DestroyCublas>;
using CublasLtHandle = Owner<cublasLtHandle_t, DestroyCublasLt>;
using LtMatmulDesc = Owner<cublasLtMatmulDesc_t, DestroyLtMatmulDesc>;
using LtLayout = Owner<cublasLtMatrixLayout_t, DestroyLtLayout>;
using LtPreference = Owner<cublasLtMatmulPreference_t, DestroyLtPreference>;

// Makes `device` the calling thread's current device for the scope, then restores the previous
// one. For code that may run on a thread whose current device is another, such as a destructor
// on the host thread after the workers joined: cuBLAS handles and memory are released with
// their own device current. Never throws; a failure leaves the current device as it was.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) noexcept : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_ && cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
  }

 private:
  int device_;
  int previous_ = -1;
};

// All of these act on the calling thread's current device.

// A non-blocking stream: no implicit ordering against the legacy default stream.
inline Stream make_stream() {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

// An event for ordering only: no timing, so recording and waiting stay cheap.
inline Event make_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

// An event that records a time, for cudaEventElapsedTime.
inline Event make_timing_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return Event(e);
}

inline DeviceMemory make_device_memory(std::size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return DeviceMemory(p);
}

inline PinnedMemory make_pinned_memory(std::size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes));
  return PinnedMemory(p);
}

// A cuBLAS handle whose work goes to `stream`.
inline CublasHandle make_cublas(cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  CublasHandle owner(h);
  CUBLAS_CHECK(cublasSetStream(h, stream));
  return owner;
}

}  // namespace lockstep::cuda
