// A run's memory as the GPU's driver counts it, for the summary (Summary::device_memory).
//
// Note [Device memory measured]
// The memory plan (Note [Memory plan] in memory_plan.hpp) counts what lockstep allocates; a GPU
// also holds the CUDA context, the libraries' code (loaded lazily, at a kernel's first launch)
// and their handles and workspaces, and NCCL's buffers. To check the plan against the device,
// the trainer asks the driver (cudaMemGetInfo: the GPU's memory less what is free, every
// process's and context's) twice per GPU of this process:
//   - baseline: before the communicators are made and before any worker allocates (the call
//     makes the primary context if nothing had): the context, and whatever else is on the GPU;
//   - peak: after each worker's last step and its final eval, before anything is freed, the
//     most any worker of the GPU saw (workers sharing a GPU all count in it).
// Why the second figure is the run's peak: every buffer a step uses is allocated before step 1
// (no allocation inside a step: Note [Host syncs] in device.hpp counts the waits one would
// cost), and nothing is freed until the workers tear down, so what is in use only grows over
// the run, and its end holds the most. Growing a device's scratch frees the old buffer before
// it allocates the new. A library's allocation made and freed within a step would not show; the
// libraries lockstep calls take their workspaces from lockstep (cuBLASLt's, cuDNN's) or keep
// them (cuBLAS's). bench/device_memory.py (gpu_check's memory phase) checks that from outside,
// polling NVML as the run goes.
// peak - baseline is what the run added to the GPU: the plan's per-worker total times the
// workers on it, plus the libraries' code and workspaces and the communicators' buffers.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/trainer.hpp"

namespace lockstep::detail {

struct DeviceMemoryUse {
  std::size_t used = 0;   // the GPU's memory less what is free, bytes
  std::size_t total = 0;  // the GPU's memory, bytes
};

// GPU `device`'s memory in use as its driver counts it, or nullopt where the backend named
// `backend` has no such figure (the CPU, a build without CUDA) or the query failed.
std::optional<DeviceMemoryUse> device_memory_in_use(std::string_view backend, int device);

// One run's figures per GPU (Note [Device memory measured]). Thread-safe: workers sample.
class DeviceMemoryRecord {
 public:
  // Before the run allocates: each GPU of `devices` (repeats counted once).
  void take_baseline(std::string_view backend, std::span<const int> devices) {
    std::lock_guard lock(mutex_);
    backend_ = backend;
    for (const int id : devices)
      if (!gpus_.contains(id))
        if (const auto use = device_memory_in_use(backend_, id))
          gpus_[id] = {.device = id, .total_bytes = use->total, .baseline_bytes = use->used,
                       .peak_bytes = use->used};
  }
  // A worker of GPU `device` after its last step (and eval), before it frees anything.
  void sample(int device) {
    std::lock_guard lock(mutex_);
    const auto gpu = gpus_.find(device);
    if (gpu == gpus_.end()) return;  // no baseline: not a GPU
    if (const auto use = device_memory_in_use(backend_, device))
      gpu->second.peak_bytes = std::max(gpu->second.peak_bytes, use->used);
  }
  std::vector<Summary::DeviceMemory> figures() const {
    std::lock_guard lock(mutex_);
    std::vector<Summary::DeviceMemory> out;
    for (const auto& [id, gpu] : gpus_) out.push_back(gpu);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::string backend_;
  std::map<int, Summary::DeviceMemory> gpus_;
};

// The process's peak resident memory so far (getrusage's ru_maxrss, KiB on Linux), bytes.
inline std::size_t peak_resident_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;
}

}  // namespace lockstep::detail
