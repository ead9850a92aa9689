// The CUDA backend: one worker thread per configured GPU id, each with its own CudaDevice.
// Workers on distinct GPUs are joined by NCCL; repeated ids (several replicas on one GPU, which
// NCCL refuses) by the peer communicator. See cuda_backend.hpp for the choice.
#include "cuda/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>
#include <nccl.h>

#include <algorithm>
#include <set>
#include <span>
#include <stdexcept>

#include <fmt/format.h>

#include "cuda/check.hpp"
#include "cuda/handles.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/nccl_comm.hpp"
#include "cuda/peer_comm.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace {

// CUDA encodes 13.0 as 13000.
std::string cuda_version(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }

// NCCL encodes 2.28.9 as 22809 since 2.9, and 2.8.4 as 2804 before.
std::string nccl_version(int v) {
  if (v >= 20900) return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, v / 100 % 10, v % 100);
}

// Throws InputError unless every id names a usable GPU.
void check_device_ids(std::span<const int> ids) {
  const GpuProbe probe = probe_gpus();
  if (probe.count == 0)
    throw InputError(no_gpu_message(probe));
  for (int id : ids)
    if (id < 0 || id >= probe.count)
      throw InputError(fmt::format(
          "trainer.devices: GPU {} does not exist; this machine has {} GPU(s), ids 0 to {}", id,
          probe.count, probe.count - 1));
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options) : options_(options) {}

  std::string_view name() const noexcept override { return "cuda"; }

  std::vector<DeviceInfo> devices() const override {
    const GpuProbe probe = probe_gpus();
    if (probe.count == 0) return {};
    int runtime = 0, driver = 0, nccl = 0;
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    NCCL_CHECK(ncclGetVersion(&nccl));
    std::vector<DeviceInfo> out;
    for (int id = 0; id < probe.count; ++id) {
      cudaDeviceProp prop{};
      CUDA_CHECK(cudaGetDeviceProperties(&prop, id));
      out.push_back({.backend = "cuda",
                     .id = id,
                     .name = prop.name,
                     .memory_bytes = prop.totalGlobalMem,
                     .detail = fmt::format("sm_{0}{1} (compute capability {0}.{1}), CUDA runtime "
                                           "{2}, driver {3}, NCCL {4}",
                                           prop.major, prop.minor, cuda_version(runtime),
                                           cuda_version(driver), nccl_version(nccl)),
                     .matmul = fmt::format("cuBLAS ({}), linear layers through cuBLASLt",
                                           to_string(options_.precision))});
    }
    return out;
  }

  using Backend::create_communicators;
  std::vector<std::unique_ptr<Communicator>> create_communicators(
      std::span<const int> device_ids, std::shared_ptr<ProcessGroup> processes) override {
    check_device_ids(device_ids);
    const bool several = processes && processes->size() > 1;
    if (options_.comm == CommKind::nccl && !distinct(device_ids))
      throw InputError(
          "trainer.devices: NCCL needs a distinct GPU per worker, and these ids repeat; use the "
          "peer communicator for several workers on one GPU");
    const bool nccl = uses_nccl(device_ids, several);
    if (!nccl && several)
      throw InputError(
          "trainer.comm: the peer communicator joins the workers of one process only; across "
          "processes use nccl, with a distinct GPU per worker");
    return nccl ? cuda::make_nccl_group(device_ids, std::move(processes))
                : cuda::make_peer_group(device_ids);
  }

  // Note [Shrink] in src/train/recovery.hpp: either group is made anew over the survivors, the
  // aborted one destroyed once every worker has drained it. An NCCL group gets a new unique id
  // and communicators; the old ones were aborted without waiting for a worker inside them
  // (Note [Abort without the lock] in abortable_slot.hpp). Across processes the trainer refuses
  // shrink before it asks.
  bool rebuilds_communicators(std::span<const int> /*device_ids*/) const noexcept override {
    return true;
  }

  // Called on the worker's thread: the device becomes that thread's current device. The CPU's
  // `workers` and `threads_per_device` do not apply to a GPU.
  std::unique_ptr<Device> create_device(int device_id, int /*workers*/,
                                        int /*threads_per_device*/) override {
    check_device_ids(std::span<const int>(&device_id, 1));
    auto device = std::make_unique<cuda::CudaDevice>(device_id);
    device->set_tf32(options_.precision == Precision::tf32);
    return device;
  }

 private:
  static bool distinct(std::span<const int> ids) {
    return std::set<int>(ids.begin(), ids.end()).size() == ids.size();
  }
  // NCCL when asked for, or by default over distinct GPUs; else the peer communicator.
  // automatic: NCCL where the workers have a GPU each and there is another rank to reach. One
  // worker of one process gets the peer group of one rank, whose collectives move nothing: a
  // one-rank NCCL communicator held 1.06 GiB of the H200's memory that the plan does not count
  // (bench/GPU.md, 2026-12-04).
  bool uses_nccl(std::span<const int> ids, bool several) const {
    return options_.comm == CommKind::nccl ||
           (options_.comm == CommKind::automatic && distinct(ids) && (ids.size() > 1 || several));
  }

  BackendOptions options_;
};

}  // namespace

namespace {

// The driver's state in words, as `lockstep devices` and every no-GPU message say it: a machine
// without a driver reads "no NVIDIA driver found", not the runtime's "CUDA driver version is
// insufficient".
std::string driver_state(cudaError_t status, int driver, int count) {
  if (status == cudaSuccess && count > 0)
    return fmt::format("NVIDIA driver for CUDA {}, {} GPU(s)", cuda_version(driver), count);
  if (status == cudaSuccess || status == cudaErrorNoDevice)
    return fmt::format("NVIDIA driver for CUDA {}, but no GPU found", cuda_version(driver));
  if (status == cudaErrorInsufficientDriver && driver == 0) return "no NVIDIA driver found";
  if (status == cudaErrorInsufficientDriver)
    return fmt::format("the NVIDIA driver supports CUDA {} only, older than the runtime",
                       cuda_version(driver));
  return fmt::format("no usable GPU (cudaGetDeviceCount: {}: {})", cudaGetErrorName(status),
                     cudaGetErrorString(status));
}

}  // namespace

GpuProbe probe_gpus() {
  int count = 0, driver = 0;  // count is left untouched when the call fails (no driver)
  const cudaError_t status = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  if (status == cudaSuccess && count > 0) return {count, {}};
  (void)cudaDriverGetVersion(&driver);  // 0 without a driver
  return {0, driver_state(status, driver, 0)};
}

std::optional<std::pair<std::size_t, std::size_t>> gpu_memory_in_use(int id) {
  cuda::DeviceGuard guard(id);  // a worker's thread or the host's: the GPU asked about
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return std::pair{total - std::min(free, total), total};
}

CudaSupport cuda_backend_support() {
  // Each of these answers without a driver or a GPU.
  int runtime = 0, driver = 0, nccl = 0, cublas_major = 0, cublas_minor = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);  // 0 without a driver
  (void)ncclGetVersion(&nccl);
  (void)cublasGetProperty(MAJOR_VERSION, &cublas_major);
  (void)cublasGetProperty(MINOR_VERSION, &cublas_minor);
  const std::string linked =
      fmt::format("CUDA runtime {}, cuBLAS {}.{}, NCCL {} linked", cuda_version(runtime),
                  cublas_major, cublas_minor, nccl_version(nccl));

  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  const std::string state = driver_state(status, driver, status == cudaSuccess ? count : 0);
  if (status != cudaSuccess) count = 0;
  return {.built = true, .gpus = count, .summary = state + "; " + linked, .cudnn = {}};
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

}  // namespace lockstep
