// The CUDA backend's entry points, for select_backend.cpp and the tests. No CUDA types here, so
// any translation unit of the library may include it (when LOCKSTEP_HAVE_CUDA is defined).
//
//   lockstep::GpuProbe probe = lockstep::probe_gpus();
//   if (probe.count > 0) backend = lockstep::make_cuda_backend();
//   else std::puts(probe.reason.c_str());   // e.g. no driver
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "lockstep/device.hpp"

namespace lockstep {

struct GpuProbe {
  int count = 0;       // GPUs this process can use
  std::string reason;  // why there is none, when count == 0
};

// The message for trainer.backend cuda on a machine without a usable GPU: why, and how to train
// on the CPU instead, in the config's spelling (a YAML file, a Python dict and a C++ Config all
// have trainer.backend); the command line checks first and says it in its own (Note [A fix in
// the spelling used] in src/cli/command_args.hpp).
inline std::string no_gpu_message(const GpuProbe& probe) {
  return "trainer.backend: cuda was requested, but no usable GPU: " + probe.reason +
         "; to train on the CPU, set trainer.backend to cpu (or auto: the GPUs when there are "
         "some, else the CPU)";
}

// Asks the CUDA runtime for the GPUs. Reports a missing driver or device in `reason`; does not
// throw for them.
GpuProbe probe_gpus();

// GPU `id`'s memory as its driver counts it, bytes: {in use (the total less what is free,
// every process's and context's), total}; nullopt when the query fails. Makes the primary
// context if nothing had (Note [Device memory measured] in src/train/device_memory.hpp).
std::optional<std::pair<std::size_t, std::size_t>> gpu_memory_in_use(int id);

// The driver's state and the linked CUDA runtime, cuBLAS and NCCL versions, in words.
CudaSupport cuda_backend_support();

// options.comm picks the data plane: NCCL when every worker has its own GPU (automatic with
// distinct ids and more than one rank; NCCL refuses two ranks on one GPU), or the peer
// communicator, our in-process all-reduce over device memory, for any ids including repeated
// ones, and for one worker alone. options.precision tf32
// switches cuBLAS to TF32 tensor-core math on every device.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options = {});

}  // namespace lockstep
