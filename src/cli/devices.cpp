// `lockstep devices`: the backends, devices and MPI support this binary has, and what a device
// means on each backend.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {
namespace {

// One line per device: "cpu:0  NAME  MEM GiB  DETAIL".
void print_devices(const Backend& backend) {
  const std::vector<DeviceInfo> list = backend.devices();
  if (list.empty()) fmt::print("{}: no usable device\n", backend.name());
  for (const DeviceInfo& d : list)
    fmt::print("{}:{}  {}  {:.1f} GiB  {}{}\n", d.backend, d.id, d.name,
               static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0), d.detail,
               d.matmul.empty() ? "" : "; matrix products: " + d.matmul);
}

// On the CPU a device is a worker: as many as there are hardware threads, each computing on one
// of them, since trainer.threads_per_device 0 divides the threads between the workers.
void explain_cpu() {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  fmt::print("cpu backend: a device is a worker thread with its own replica and data shard\n"
             "  (trainer.devices: N runs N workers; the ids only name them)\n");
  fmt::print("cpu: {0} hardware threads here; suggested trainer.devices: {0}, one worker per "
             "hardware thread\n"
             "  (trainer.threads_per_device 0 divides the threads between the workers: fewer "
             "workers\n  compute on more threads each; more workers than threads share them)\n",
             threads);
}

void explain_cuda(const CudaSupport& cuda) {
  fmt::print("cuda backend: a device is one GPU, by its CUDA id ({} usable here)\n"
             "  (trainer.devices: N runs one worker on each of GPUs 0..N-1)\n",
             cuda.gpus);
}

}  // namespace

int devices(const std::shared_ptr<ProcessGroup>& processes) {
  fmt::print("lockstep {}\n", kVersion);
  if (const std::string mpi = mpi_library(); mpi.empty())
    fmt::print("mpi: not built in (single-process runs only)\n");
  else if (processes)
    fmt::print("mpi: built in ({}); this is process {} of {}\n", mpi, processes->rank(),
               processes->size());
  else
    fmt::print("mpi: built in ({}); not started by mpirun or srun\n", mpi);
  const CudaSupport cuda = cuda_support();
  if (cuda.built) fmt::print("cuda: built in ({})\n", cuda.summary);
  else fmt::print("cuda: not built in (CPU-only build)\n");
  if (cuda.built)
    fmt::print("cudnn: {}\n", cuda.cudnn.empty() ? "not built in (attention runs materialised on "
                                                  "cuda)" : cuda.cudnn);
  explain_cpu();
  print_devices(*make_backend(BackendKind::cpu));
  if (cuda.built) explain_cuda(cuda);
  if (cuda.gpus > 0) print_devices(*make_backend(BackendKind::cuda));
  // model.attention auto at GPT-2's shape (context 1024, head size 64): on the CPU in fp32
  // (below kFusedAttentionContext it runs fp32 materialised), on cuda in bf16, the precision
  // of its fused path (choose_attention).
  for (const std::string_view backend : {"cpu", "cuda"}) {
    if (backend == "cuda" && cuda.gpus == 0) continue;  // a plan for a GPU this machine lacks
    const Precision precision = backend == "cuda" ? Precision::bf16 : Precision::fp32;
    const AttentionChoice auto_choice =
        choose_attention(AttentionKind::automatic, backend, precision, 1024, 64);
    fmt::print("{}: attention (model.attention auto, {}, context 1024, head size 64): {}: {}\n",
               backend, to_string(precision), to_string(auto_choice.path), auto_choice.detail);
  }
  return kExitOk;
}

}  // namespace lockstep::cli
