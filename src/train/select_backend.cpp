// The one place that knows which backends this build has. Everything else talks to Backend.
#include <algorithm>

#include <fmt/format.h>

#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"
#include "train/device_memory.hpp"

#ifdef LOCKSTEP_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
#include "cuda/cudnn_attention.hpp"
#endif

namespace lockstep {

std::vector<std::unique_ptr<Communicator>> Backend::create_communicators(
    std::span<const int> device_ids) {
  return create_communicators(device_ids, nullptr);
}

CudaSupport cuda_support() {
#ifdef LOCKSTEP_HAVE_CUDA
  CudaSupport support = cuda_backend_support();
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  support.cudnn = cuda::cudnn_versions();
#endif
  return support;
#else
  return {};
#endif
}

namespace detail {

std::optional<DeviceMemoryUse> device_memory_in_use(std::string_view backend,
                                                    [[maybe_unused]] int device) {
#ifdef LOCKSTEP_HAVE_CUDA
  if (backend == "cuda")
    if (const auto use = gpu_memory_in_use(device)) return DeviceMemoryUse{use->first, use->second};
#endif
  (void)backend;
  return std::nullopt;
}

}  // namespace detail

namespace {

// Why cuDNN's fused attention cannot run on cuda for this precision, context and head size (0:
// unknown); empty when it can.
std::string cuda_fused_refusal([[maybe_unused]] Precision precision,
                               [[maybe_unused]] int context, [[maybe_unused]] int head_size) {
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  std::string why =
      cuda::cudnn_attention_refusal(precision, head_size, context, cuda::cudnn_runtime_version());
  // The rest is cuDNN's to say (its support for the shape on this GPU): its graphs are built
  // once per shape when there is a GPU to build them on; a refusal there says which step and why.
  if (why.empty() && head_size > 0 && probe_gpus().count > 0)
    why = cuda::cudnn_attention_probe({1, context, 1, head_size});
  return why;
#else
  return "this build has no cuDNN fused attention (cuDNN or the cuDNN frontend was not found "
         "when it was configured)";
#endif
}

// On cuda the fused path is cuDNN's (Note [cuDNN attention] in src/cuda/cudnn_attention.hpp).
// auto picks it under bf16, as llm.c and PyTorch run it; it is not yet measured against the
// materialised path on a GPU here (issue 32: scripts/gpu_check.sh times both), so this choice
// is pending that measurement.
AttentionChoice choose_cuda_attention(AttentionKind requested, Precision precision, int context,
                                      int head_size) {
  const std::string name = "cuDNN fused attention (flash, causal, bf16)";
  const std::string why = requested == AttentionKind::materialized
                              ? std::string()
                              : cuda_fused_refusal(precision, context, head_size);
  switch (requested) {
    case AttentionKind::fused:
      if (!why.empty())
        throw InputError(fmt::format("model.attention: fused was requested, but cuDNN's fused "
                                     "attention cannot run: {}; use 'auto' or 'materialized'",
                                     why));
      return {AttentionKind::fused, name};
    case AttentionKind::materialized:
      return {AttentionKind::materialized, "(T, T) matrices, as requested"};
    case AttentionKind::automatic:
      break;
  }
  if (!why.empty())
    return {AttentionKind::materialized, fmt::format("(T, T) matrices (auto: {})", why)};
  return {AttentionKind::fused, name + " (auto: bf16; not yet measured against the materialised "
                                       "path on a GPU)"};
}

}  // namespace

AttentionChoice choose_attention(AttentionKind requested, std::string_view backend,
                                 Precision precision, int context, int head_size) {
  if (backend == "cuda") return choose_cuda_attention(requested, precision, context, head_size);
  // Where this build has fused attention: the CPU's tiled online softmax, in every precision
  // (Note [Tiled attention] in src/cpu/ops/attention.cpp).
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
