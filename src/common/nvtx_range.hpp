// Ranges for Nsight Systems on the calling thread; see Note [NVTX ranges].
//
//   { detail::NvtxRange range("forward"); ... }  // pushed here, popped at the end of the scope
#pragma once

#include <cstddef>
#include <cstdio>

#if LOCKSTEP_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace lockstep::detail {

// Note [NVTX ranges]
//   A worker's phases show in Nsight Systems under the names the trace gives them (trace.hpp):
//   forward, backward per layer, each bucket's all-reduce (on a GPU its enqueue; the comm
//   stream, named by the communicator, shows the kernels), the optimiser, eval, checkpoints.
//   NVTX 3 is header-only in the CUDA toolkit and finds its tool at run time: without one
//   attached, a push or pop only tests a pointer. Builds without the toolkit compile it away.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept {
#if LOCKSTEP_HAVE_NVTX
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if LOCKSTEP_HAVE_NVTX
    nvtxRangePop();
#endif
  }
  // `prefix` followed by `index`, "backward layers." and 3: "backward layers.3", formatted
  // without allocating, and only when NVTX is built in.
  NvtxRange(const char* prefix, std::size_t index) noexcept {
#if LOCKSTEP_HAVE_NVTX
    char name[96];
    std::snprintf(name, sizeof name, "%s%zu", prefix, index);
    nvtxRangePushA(name);
#else
    (void)prefix;
    (void)index;
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace lockstep::detail
