// The one place that knows which backends this build has. Everything else talks to Backend.
#include <algorithm>

#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"

#ifdef LOCKSTEP_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace lockstep {

std::vector<std::unique_ptr<Communicator>> Backend::create_communicators(
    std::span<const int> device_ids) {
  return create_communicators(device_ids, nullptr);
}

CudaSupport cuda_support() {
#ifdef LOCKSTEP_HAVE_CUDA
  return cuda_backend_support();
#else
  return {};
#endif
}

std::unique_ptr<Backend> make_backend(BackendKind kind,
                                      [[maybe_unused]] std::span<const int> device_ids,
                                      [[maybe_unused]] const BackendOptions& options) {
  switch (kind) {
    case BackendKind::cpu:
      return make_cpu_backend();
    case BackendKind::automatic:
#ifdef LOCKSTEP_HAVE_CUDA
    {
      // CUDA when the GPUs can hold the requested devices; otherwise the CPU, which takes any ids.
      const GpuProbe probe = probe_gpus();
      const bool fits = std::all_of(device_ids.begin(), device_ids.end(),
                                    [&](int id) { return id >= 0 && id < probe.count; });
      if (probe.count > 0 && fits) return make_cuda_backend(options);
    }
#endif
      return make_cpu_backend();
    case BackendKind::cuda: {
#ifdef LOCKSTEP_HAVE_CUDA
      const GpuProbe probe = probe_gpus();
      if (probe.count == 0)
        throw InputError("trainer.backend: cuda was requested, but no usable GPU: " + probe.reason);
      return make_cuda_backend(options);
#else
      throw InputError(
          "trainer.backend: cuda was requested, but this build of lockstep has no CUDA backend; "
          "use 'cpu' or 'auto'");
#endif
    }
  }
  return make_cpu_backend();
}

}  // namespace lockstep
