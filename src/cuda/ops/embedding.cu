// Token and position embeddings, forward and backward (CPU: src/cpu/ops/embedding.cpp).
//
// The backward pass is deterministic without atomics: the embedding gradient sorts the rows by
// token (a stable radix sort) so that each token's rows are added in row order, as on the CPU.
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

// out (rows, C) = wte[ids[r]] + wpe[r % T, or positions[r]] (wte[ids[r]] without wpe): a block
// per row (grid-stride over rows), threads over the channels.
__global__ void embedding_forward_kernel(const float* ids, const float* wte, const float* wpe,
                                         float* out, std::size_t rows, std::size_t T,
                                         std::size_t C, const std::int32_t* positions) {
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* tok = wte + static_cast<std::size_t>(ids[r]) * C;
    float* o = out + r * C;
    if (!wpe) {
      for (std::size_t c = threadIdx.x; c < C; c += kThreads) o[c] = tok[c];
      continue;
    }
    const std::size_t p = positions ? static_cast<std::size_t>(positions[r]) : r % T;
    const float* pos = wpe + p * C;
    for (std::size_t c = threadIdx.x; c < C; c += kThreads) o[c] = tok[c] + pos[c];
  }
}

// The same from bf16 tables, widened, the sum in fp32: as above.
__global__ void embedding_forward_bf16_kernel(const float* ids, const std::uint16_t* wte,
                                              const std::uint16_t* wpe, float* out,
                                              std::size_t rows, std::size_t T, std::size_t C,
                                              const std::int32_t* positions) {
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::uint16_t* tok = wte + static_cast<std::size_t>(ids[r]) * C;
    float* o = out + r * C;
    if (!wpe) {
      for (std::size_t c = threadIdx.x; c < C; c += kThreads) o[c] = detail::bf16_to_float(tok[c]);
      continue;
    }
    const std::size_t p = positions ? static_cast<std::size_t>(positions[r]) : r % T;
    const std::uint16_t* pos = wpe + p * C;
    for (std::size_t c = threadIdx.x; c < C; c += kThreads)
      o[c] = detail::bf16_to_float(tok[c]) + detail::bf16_to_float(pos[c]);
  }
}

// Sort keys of embedding_backward: token[r] = ids[r], row[r] = r.
__global__ void embedding_keys_kernel(const float* ids, unsigned* token, int* row, int rows) {
  for (std::size_t r = first_index(); r < static_cast<std::size_t>(rows); r += grid_stride()) {
    token[r] = static_cast<unsigned>(ids[r]);
    row[r] = static_cast<int>(r);
  }
}

// Sort keys of a packed dwpe: key[r] = positions[r], row[r] = r.
__global__ void position_keys_kernel(const std::int32_t* positions, unsigned* key, int* row,
                                     int rows) {
  for (std::size_t r = first_index(); r < static_cast<std::size_t>(rows); r += grid_stride()) {
    key[r] = static_cast<unsigned>(positions[r]);
    row[r] = static_cast<int>(r);
  }
}

// dwte (V, C): token and row hold the rows sorted by token, each token's rows in increasing
// order (the sort is stable). The block at the first position of each token's run adds that
// token's rows in that order: dwte[t][c] = ((dwte[t][c] + dout[r0][c]) + dout[r1][c]) + ...,
// the CPU's float additions exactly. No atomics: the same bits on every run.
__global__ void embedding_dwte_kernel(const unsigned* token, const int* row, const float* dout,
                                      float* dwte, int rows, std::size_t C) {
  for (int i = static_cast<int>(blockIdx.x); i < rows; i += static_cast<int>(gridDim.x)) {
    const unsigned t = token[i];
    if (i > 0 && token[i - 1] == t) continue;  // not the first of its run: the same for the block
    int end = i + 1;
    while (end < rows && token[end] == t) ++end;
    float* w = dwte + static_cast<std::size_t>(t) * C;
    for (std::size_t c = threadIdx.x; c < C; c += kThreads) {
      float acc = w[c];
      for (int j = i; j < end; ++j) acc += dout[static_cast<std::size_t>(row[j]) * C + c];
      w[c] = acc;
    }
  }
}

// dwpe (T, C): one thread per (t, c), tc = t * C + c, adding dout[b][t][c] for b in order:
// the CPU's float additions exactly.
__global__ void embedding_dwpe_kernel(const float* dout, float* dwpe, int batch,
                                      std::size_t TC) {
  for (std::size_t tc = first_index(); tc < TC; tc += grid_stride()) {
    float acc = dwpe[tc];
    for (int b = 0; b < batch; ++b) acc += dout[static_cast<std::size_t>(b) * TC + tc];
    dwpe[tc] = acc;
  }
}

// embedding_backward's scratch: four arrays of `rows` ints (sort keys and values, in and out),
// then the radix sort's own temporary storage, each part aligned to 256 bytes.
struct SortScratch {
  unsigned* token_in;
  unsigned* token;
  int* row_in;
  int* row;
  void* temp;
  std::size_t temp_bytes;
};

constexpr std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

std::size_t sort_temp_bytes(int rows) {
  std::size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const unsigned*>(nullptr),
                                             static_cast<unsigned*>(nullptr),
                                             static_cast<const int*>(nullptr),
                                             static_cast<int*>(nullptr), rows));
  return bytes;
}

// Bytes of each of the four arrays.
std::size_t sort_array_bytes(int rows) {
  return aligned(static_cast<std::size_t>(rows) * sizeof(int));
}

SortScratch sort_scratch(void* scratch, std::size_t scratch_bytes, int rows) {
  const std::size_t part = sort_array_bytes(rows);
  auto* base = static_cast<char*>(scratch);
  return {reinterpret_cast<unsigned*>(base), reinterpret_cast<unsigned*>(base + part),
          reinterpret_cast<int*>(base + 2 * part), reinterpret_cast<int*>(base + 3 * part),
          base + 4 * part, scratch_bytes - 4 * part};
}

}  // namespace

void launch_embedding_forward(cudaStream_t stream, const float* ids, const float* wte,
                              const float* wpe, float* out, int batch, int T, int C,
                              const std::int32_t* positions) {
  const std::size_t rows = static_cast<std::size_t>(batch) * static_cast<std::size_t>(T);
  if (rows == 0 || C == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(rows, kMaxBlocks));
  embedding_forward_kernel<<<blocks, kThreads, 0, stream>>>(ids, wte, wpe, out, rows,
                                                            static_cast<std::size_t>(T),
                                                            static_cast<std::size_t>(C),
                                                            positions);
  CUDA_CHECK(cudaGetLastError());
}

void launch_embedding_forward(cudaStream_t stream, const float* ids, const std::uint16_t* wte,
                              const std::uint16_t* wpe, float* out, int batch, int T, int C,
                              const std::int32_t* positions) {
  const std::size_t rows = static_cast<std::size_t>(batch) * static_cast<std::size_t>(T);
  if (rows == 0 || C == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(rows, kMaxBlocks));
  embedding_forward_bf16_kernel<<<blocks, kThreads, 0, stream>>>(
      ids, wte, wpe, out, rows, static_cast<std::size_t>(T), static_cast<std::size_t>(C),
      positions);
  CUDA_CHECK(cudaGetLastError());
}

std::size_t embedding_backward_scratch_bytes(int batch, int T) {
  const int rows = batch * T;
  if (rows <= 0) return 0;
  return 4 * sort_array_bytes(rows) + sort_temp_bytes(rows);
}

void launch_embedding_backward(cudaStream_t stream, const float* ids, const float* dout,
                               float* dwte, float* dwpe, int batch, int T, int C,
                               void* scratch, std::size_t scratch_bytes,
                               const std::int32_t* positions) {
  const int rows = batch * T;
  if (rows <= 0 || C == 0) return;
  const SortScratch s = sort_scratch(scratch, scratch_bytes, rows);
  embedding_keys_kernel<<<blocks_for(static_cast<std::size_t>(rows)), kThreads, 0, stream>>>(
      ids, s.token_in, s.row_in, rows);
  CUDA_CHECK(cudaGetLastError());
  std::size_t temp_bytes = s.temp_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, temp_bytes,
                                             static_cast<const unsigned*>(s.token_in), s.token,
                                             static_cast<const int*>(s.row_in), s.row, rows, 0,
                                             static_cast<int>(8 * sizeof(unsigned)), stream));
  const auto blocks = static_cast<unsigned>(std::min(static_cast<std::size_t>(rows), kMaxBlocks));
  embedding_dwte_kernel<<<blocks, kThreads, 0, stream>>>(s.token, s.row, dout, dwte, rows,
                                                         static_cast<std::size_t>(C));
  CUDA_CHECK(cudaGetLastError());
  if (!dwpe) return;  // rotary positions: no position embedding
  if (positions) {
    // Packed: the rows sorted by position (stable) in the same scratch, which the token
    // kernel above is done with (one stream), then each position's rows added in row order
    // by the same kernel: dwpe[p] = ((dwpe[p] + dout[r0]) + dout[r1]) + ..., the CPU's order.
    position_keys_kernel<<<blocks_for(static_cast<std::size_t>(rows)), kThreads, 0, stream>>>(
        positions, s.token_in, s.row_in, rows);
    CUDA_CHECK(cudaGetLastError());
    temp_bytes = s.temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, temp_bytes,
                                               static_cast<const unsigned*>(s.token_in), s.token,
                                               static_cast<const int*>(s.row_in), s.row, rows, 0,
                                               static_cast<int>(8 * sizeof(unsigned)), stream));
    embedding_dwte_kernel<<<blocks, kThreads, 0, stream>>>(s.token, s.row, dout, dwpe, rows,
                                                           static_cast<std::size_t>(C));
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  const std::size_t tc = static_cast<std::size_t>(T) * static_cast<std::size_t>(C);
  embedding_dwpe_kernel<<<blocks_for(tc), kThreads, 0, stream>>>(dout, dwpe, batch, tc);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
