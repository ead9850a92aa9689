// The CPU device's memory, its fully connected maps, and make_cpu_device. Its kernels are in
// src/cpu/ops; see cpu_device.hpp for the invariants they keep.
#include "cpu/cpu_device.hpp"

#include <cblas.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "common/linear.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace cpu {
namespace {

constexpr std::size_t kAlignment = 64;  // bytes, for allocate()

}  // namespace

void* CpuDevice::allocate(std::size_t bytes) {
  count_host_sync();
  const std::size_t size = std::max(kAlignment, blocks_of(bytes, kAlignment) * kAlignment);
  void* p = nullptr;
  try {
    p = ::operator new(size, std::align_val_t{kAlignment});
  } catch (const std::bad_alloc&) {
    throw OutOfMemory::on_device(size, label());
  }
  std::memset(p, 0, size);
  return p;
}

void CpuDevice::deallocate(void* ptr) noexcept {
  count_host_sync();
  ::operator delete(ptr, std::align_val_t{kAlignment});
}

void CpuDevice::copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  copy(dst, host_src, bytes);
}

void CpuDevice::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  count_host_sync();
  copy(host_dst, src, bytes);
}

void CpuDevice::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

namespace {

class CpuDownload final : public Download {
 public:
  void start(std::span<const Transfer> copies) override {
    for (const Transfer& t : copies)
      if (t.bytes) std::memcpy(t.host, t.device, t.bytes);
  }
  void fence() override {}
  bool done() override { return true; }
  void wait() override {}
};

}  // namespace

std::unique_ptr<Download> CpuDevice::make_download() { return std::make_unique<CpuDownload>(); }

// Composed, always: the definition (Note [Fused linear]). Counted as a GPU counts its products.
void CpuDevice::linear_forward(const LinearForward& f) {
  detail::compose_linear_forward(*this, f);
  count_linear(LinearPath::composed);
}

void CpuDevice::linear_backward(const LinearBackward& b) {
  detail::compose_linear_backward(*this, b);
  count_linear(LinearPath::composed);    // dweight and dbias
  if (b.dx) count_linear(LinearPath::composed);
}

}  // namespace cpu

std::unique_ptr<Device> make_cpu_device(int id, int threads) {
  if (threads < 1)
    throw std::invalid_argument(
        fmt::format("cpu:{}: threads must be at least 1, got {}", id, threads));
  static std::once_flag blas_once;
  std::call_once(blas_once, [] { openblas_set_num_threads(1); });
  return std::make_unique<cpu::CpuDevice>(id, threads);
}

}  // namespace lockstep
