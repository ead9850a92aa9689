// The reduction step of the peer all-reduce (src/cuda/peer_comm.cpp): sums every rank's slice
// in rank order, as the CPU shared-memory all-reduce does.
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

__global__ void peer_reduce_kernel(PeerSlices slices, int ranks, float* out, std::size_t n,
                                   bool average, float inv) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float acc = slices.src[0][i];
    for (int r = 1; r < ranks; ++r) acc += slices.src[r][i];
    if (average) acc *= inv;
    out[i] = acc;
  }
}

}  // namespace

void launch_peer_reduce(cudaStream_t stream, const PeerSlices& slices, int ranks, float* out,
                        std::size_t n, bool average) {
  if (n == 0) return;
  const float inv = 1.0f / static_cast<float>(ranks);
  peer_reduce_kernel<<<blocks_for(n), kThreads, 0, stream>>>(slices, ranks, out, n, average, inv);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
