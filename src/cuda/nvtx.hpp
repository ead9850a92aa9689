// Names for Nsight Systems: each stream by its rank and role (NVTX 3, header-only in the CUDA
// toolkit; without a tool attached each call only checks a pointer).
#pragma once

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExtCudaRt.h>

#include <string>

namespace lockstep::cuda {

inline void name_stream(cudaStream_t stream, const std::string& name) {
  nvtxNameCudaStreamA(stream, name.c_str());
}

}  // namespace lockstep::cuda
