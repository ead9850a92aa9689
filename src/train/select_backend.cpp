// The one place that knows which backends this build has. Everything else talks to Backend.
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"

#ifdef LOCKSTEP_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace lockstep {

std::unique_ptr<Backend> make_backend(BackendKind kind) {
  switch (kind) {
    case BackendKind::cpu:
      return make_cpu_backend();
    case BackendKind::automatic:
#ifdef LOCKSTEP_HAVE_CUDA
      if (probe_gpus().count > 0) return make_cuda_backend();
#endif
      return make_cpu_backend();
    case BackendKind::cuda: {
#ifdef LOCKSTEP_HAVE_CUDA
      const GpuProbe probe = probe_gpus();
      if (probe.count == 0)
        throw InputError("trainer.backend: cuda was requested, but no usable GPU: " + probe.reason);
      return make_cuda_backend();
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
