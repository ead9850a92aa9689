// The CPU backend: N devices are N worker threads of this process, sharing the machine's cores,
// joined by the shared-memory communicator.
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "cpu/matmul.hpp"
#include "cpu/ops/isa_dispatch.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"

namespace lockstep {
namespace {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

class CpuBackend final : public Backend {
 public:
  std::string_view name() const noexcept override { return "cpu"; }

  std::vector<DeviceInfo> devices() const override {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    DeviceInfo info;
    info.backend = "cpu";
    info.id = 0;
    info.name = "host CPU";
    info.memory_bytes = pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * page : 0;
    // Note [Wide vectors for the CPU kernels]: which build of the elementwise and row kernels runs.
    info.detail = std::to_string(hardware_threads()) + " hardware threads; kernels " +
                  cpu::isa_name(cpu::active_isa());
    info.matmul = cpu::gemm_path().description;
    return {info};
  }

  using Backend::create_communicators;
  // Across processes: the shared-memory group, joined hierarchically (see comm.hpp).
  std::vector<std::unique_ptr<Communicator>> create_communicators(
      std::span<const int> device_ids, std::shared_ptr<ProcessGroup> processes) override {
    auto local = make_shared_memory_group(static_cast<int>(device_ids.size()));
    if (!processes || processes->size() == 1) return local;
    return make_hierarchical_group(std::move(local), std::move(processes));
  }

  // A new shared-memory group over the survivors: an aborted group holds nothing they need.
  bool rebuilds_communicators(std::span<const int>) const noexcept override { return true; }

  // CPU "device ids" only name the workers: any id is valid, and repeated ids are fine.
  std::unique_ptr<Device> create_device(int device_id, int workers,
                                        int threads_per_device) override {
    return make_cpu_device(device_id, cpu_threads_per_device(workers, threads_per_device));
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

int cpu_threads_per_device(int workers, int threads_per_device) {
  if (threads_per_device > 0) return threads_per_device;
  return std::max(1, hardware_threads() / std::max(1, workers));
}

}  // namespace lockstep
