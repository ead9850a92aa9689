// The one place that knows which backends this build has. Everything else talks to Backend.
#include <algorithm>

#include <fmt/format.h>

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

AttentionChoice choose_attention(AttentionKind requested, std::string_view backend,
                                 Precision precision, int context) {
  // Where this build has fused attention: the CPU's tiled online softmax, in every precision
  // (Note [Tiled attention] in src/cpu/ops/attention.cpp). CUDA has none yet (issue 32).
  const bool fused = backend == "cpu";
  const std::string fused_name = "tiled, online softmax";
  switch (requested) {
    case AttentionKind::fused:
      if (!fused)
        throw InputError(fmt::format(
            "model.attention: fused was requested, but the {} backend has no fused attention in "
            "this build; use 'auto' or 'materialized'",
            backend));
      return {AttentionKind::fused, fused_name};
    case AttentionKind::materialized:
      return {AttentionKind::materialized, "(T, T) matrices, as requested"};
    case AttentionKind::automatic:
      break;
  }
  // At short contexts in fp32 the tiles' copies and calls outweigh the masked half it skips
  // (bf16's materialised path pays for rounding passes the tiled one does not make).
  if (fused && precision != Precision::bf16 && context < kFusedAttentionContext)
    return {AttentionKind::materialized,
            fmt::format("(T, T) matrices (auto: fp32 at context {} < {}, where the tiled path "
                        "measured slower)",
                        context, kFusedAttentionContext)};
  if (fused) return {AttentionKind::fused, fused_name + " (auto)"};
  return {AttentionKind::materialized,
          fmt::format("(T, T) matrices (auto: no fused attention on {} in this build)", backend)};
}

std::string_view backend_name(BackendKind kind, [[maybe_unused]] std::span<const int> device_ids) {
  switch (kind) {
    case BackendKind::cpu:
      return "cpu";
    case BackendKind::cuda:
      return "cuda";
    case BackendKind::automatic:
      break;
  }
#ifdef LOCKSTEP_HAVE_CUDA
  // CUDA when the GPUs can hold the requested devices; otherwise the CPU, which takes any ids.
  const GpuProbe probe = probe_gpus();
  const bool fits = std::all_of(device_ids.begin(), device_ids.end(),
                                [&](int id) { return id >= 0 && id < probe.count; });
  if (probe.count > 0 && fits) return "cuda";
#endif
  return "cpu";
}

std::unique_ptr<Backend> make_backend(BackendKind kind,
                                      [[maybe_unused]] std::span<const int> device_ids,
                                      [[maybe_unused]] const BackendOptions& options) {
  switch (kind) {
    case BackendKind::cpu:
      return make_cpu_backend();
    case BackendKind::automatic:
#ifdef LOCKSTEP_HAVE_CUDA
      if (backend_name(kind, device_ids) == "cuda") return make_cuda_backend(options);
#endif
      return make_cpu_backend();
    case BackendKind::cuda: {
#ifdef LOCKSTEP_HAVE_CUDA
      const GpuProbe probe = probe_gpus();
      if (probe.count == 0)
        throw InputError(no_gpu_message(probe));
      return make_cuda_backend(options);
#else
      throw InputError(
          "trainer.backend: cuda was requested, but this build of lockstep has no CUDA backend; "
          "to train on the CPU, --set trainer.backend=cpu (or auto)");
#endif
    }
  }
  return make_cpu_backend();
}

}  // namespace lockstep
