// Ranges for Nsight Systems on the calling thread; see Note [NVTX ranges].
//
//   { detail::NvtxRange range("forward"); ... }  // pushed here, popped at the end of the scope
#pragma once

#include <cstddef>

namespace lockstep::detail {

// Note [NVTX ranges]
//   A worker's phases show in Nsight Systems under the names the trace gives them (trace.hpp):
//   forward, backward per layer, each bucket's all-reduce (on a GPU its enqueue; the comm
//   stream, named by the communicator, shows the kernels), the optimiser, eval, checkpoints.
//   NVTX 3 is header-only in the CUDA toolkit and finds its tool at run time: without one
//   attached, a push or pop only tests a pointer. Builds without the toolkit make them no-ops.
//   The calls are defined once, in src/train/trace.cpp, the one place that knows whether the
//   build has NVTX, so that every caller agrees.
void nvtx_push(const char* name) noexcept;
// `prefix` followed by `index` ("backward layers.", 3: "backward layers.3"), formatted without
// allocating, and only when NVTX is built in.
void nvtx_push(const char* prefix, std::size_t index) noexcept;
void nvtx_pop() noexcept;

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept { nvtx_push(name); }
  NvtxRange(const char* prefix, std::size_t index) noexcept { nvtx_push(prefix, index); }
  ~NvtxRange() { nvtx_pop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace lockstep::detail
