// Softmax kernels: the classifier's softmax cross-entropy (loss, correct count, dlogits) and the
// attention's causal softmax, forward and backward (CPU: src/cpu/ops/softmax.cpp).
//
// In-place row kernels (causal softmax) are safe because every element of a row is read and
// written by the same lane only, reads before writes.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/bf16.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

// kIgnoreLabel (lockstep/types.hpp): a row that adds nothing and gets a zero gradient.
constexpr std::int32_t kIgnored = -1;

// An ignored row (label kIgnored): no loss, not correct, a zero gradient row. True when the row
// is one; the block then has nothing more to do.
template <class D>
__device__ bool skip_ignored_row(int label, int row, int classes, D* dlogits, double* row_loss,
                                 int* row_correct) {
  if (label != kIgnored) return false;
  if (dlogits) {
    D* d = dlogits + static_cast<std::size_t>(row) * classes;
    for (int j = threadIdx.x; j < classes; j += kThreads) detail::store_value(&d[j], 0.0f);
  }
  if (threadIdx.x == 0) {
    row_loss[row] = 0.0;
    row_correct[row] = 0;
  }
  return true;
}

// One block: *bad_row = the first row whose label is outside [0, classes), or stays above every
// row, and that row's key as row first_row + r of the caller's batch (detail::label_error_key:
// the lowest row has the largest key) into stats->label_error. Runs before the row kernel, so
// that a bad label anywhere leaves dlogits unwritten, as on the CPU (which checks every label
// before it computes anything).
__global__ void check_labels_kernel(const std::int32_t* labels, int rows, int classes,
                                    int first_row, int* bad_row, LossAccumulator* stats) {
  for (int r = threadIdx.x; r < rows; r += kThreads)
    if ((labels[r] < 0 && labels[r] != kIgnored) || labels[r] >= classes) {
      atomicMin(bad_row, r);
      atomicMax(&stats->label_error, detail::label_error_key(first_row + r, labels[r]));
      return;  // this thread's later rows come after r
    }
}

// One block per row of logits (rows, classes): argmax, then e_j = exp(z_j - max) in float, once
// per logit, summed in double; the row's loss and correctness into row_loss / row_correct, and
// optionally the row of dlogits = (e_j / sum - [j == label]) * grad_scale, e_j parked in dlogits
// in between (each thread reads back only what it wrote; dlogits may even alias logits, as every
// logit is read before its own dlogit is written). Writes nothing if any label is bad. D: the
// storage of dlogits; bf16 has no room to park e_j, so it is computed again (the same bits) and
// the dlogit rounded as it is written.
template <class D>
__global__ void softmax_xent_rows_kernel(const float* logits, const std::int32_t* labels,
                                         int classes, D* dlogits, float grad_scale,
                                         double* row_loss, int* row_correct,
                                         const int* bad_row) {
  const int row = blockIdx.x;
  if (*bad_row < static_cast<int>(gridDim.x)) return;  // a bad label (one block a row)
  const int label = labels[row];
  if (skip_ignored_row(label, row, classes, dlogits, row_loss, row_correct)) return;
  const float* z = logits + static_cast<std::size_t>(row) * classes;

  // argmax: the first index of the largest value, as the CPU's scan with a strict '>' finds it.
  __shared__ float best_value[kThreads];
  __shared__ int best_index[kThreads];
  float bv = 0.0f;
  int bi = INT_MAX;  // INT_MAX: this thread has seen nothing yet
  for (int j = threadIdx.x; j < classes; j += kThreads)
    if (bi == INT_MAX || z[j] > bv) {
      bv = z[j];
      bi = j;
    }
  best_value[threadIdx.x] = bv;
  best_index[threadIdx.x] = bi;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = best_value[threadIdx.x + stride], mv = best_value[threadIdx.x];
      const int oi = best_index[threadIdx.x + stride], mi = best_index[threadIdx.x];
      if (oi != INT_MAX && (mi == INT_MAX || ov > mv || (ov == mv && oi < mi))) {
        best_value[threadIdx.x] = ov;
        best_index[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const int argmax = best_index[0];
  const float zmax = z[argmax], zlabel = z[label];
  // Every thread has read them before any dlogit is written: where dlogits aliases the logits
  // (the chunked LM head, Note [Chunked classifier] in src/model/lm_head.cpp) another warp's
  // first parked e_j could otherwise overwrite z[argmax] or z[label] before this warp reads it.
  __syncthreads();

  D* d = dlogits ? dlogits + static_cast<std::size_t>(row) * classes : nullptr;
  constexpr bool kParked = std::is_same_v<D, float>;
  double partial = 0.0;
  for (int j = threadIdx.x; j < classes; j += kThreads) {
    const float e = expf(z[j] - zmax);
    if constexpr (kParked)
      if (d) d[j] = e;
    partial += e;
  }
  const double sum = block_sum(partial);

  if (threadIdx.x == 0) {
    row_loss[row] = log(sum) - (double(zlabel) - zmax);  // logsumexp - z[label]
    row_correct[row] = argmax == label ? 1 : 0;
  }
  if (!d) return;
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = threadIdx.x; j < classes; j += kThreads) {
    float e;
    if constexpr (kParked)
      e = d[j];
    else
      e = expf(z[j] - zmax);
    detail::store_value(&d[j], (e * inv - (j == label ? 1.0f : 0.0f)) * grad_scale);
  }
}

// The fused classifier (Note [Fused classifier] in src/cpu/ops/softmax.cpp): one block per row
// of bf16 logits (rows, classes). One read of the row computes, per thread and then over the
// block, the online softmax statistics (the largest logit and its first index, and the sum of
// exp(z - largest) rescaled as the largest grows); a second pass writes the bf16 gradient over
// the same elements, each thread its own, after every read of the first pass (the row is 100 KB
// for GPT-2: its second read comes from L2). Rows of a multiple of 8 classes, 16-byte aligned,
// move 8 logits per load and store. dlogits (or null) may alias logits. Tolerance against the
// CPU: exp in float, the sum in double rescaled in another order; dlogits within a bf16
// neighbour, the loss within 1e-6 relative.
struct OnlineMax {
  float m = -INFINITY;  // the largest value seen
  double s = 0.0;       // sum of exp(v - m) over the values seen
  int i = INT_MAX;      // the first index of m; INT_MAX: nothing above -inf seen yet
};

__device__ inline void add_value(OnlineMax& r, float v, int j) {
  if (v > r.m) {
    r.s = r.s * expf(r.m - v) + 1.0;  // exp(-inf) = 0 for the first value
    r.m = v;
    r.i = j;
  } else if (v != -INFINITY) {  // the padding adds nothing; a NaN makes the sum NaN
    r.s += expf(v - r.m);
  }
}

__device__ inline OnlineMax merge(OnlineMax a, OnlineMax b) {
  if (b.i == INT_MAX) return a;
  if (a.i == INT_MAX) return b;
  OnlineMax r;
  r.m = fmaxf(a.m, b.m);
  r.s = a.s * expf(a.m - r.m) + b.s * expf(b.m - r.m);
  r.i = b.m > a.m || (b.m == a.m && b.i < a.i) ? b.i : a.i;
  return r;
}

// Packs of kPack bf16 values, 16 bytes (Note [Wide loads in the element-wise kernels] in
// common.cuh).
__global__ void fused_classifier_rows_kernel(const std::uint16_t* logits,
                                             const std::int32_t* labels, int classes, bool packed,
                                             std::uint16_t* dlogits, float grad_scale,
                                             double* row_loss, int* row_correct,
                                             const int* bad_row) {
  const int row = blockIdx.x;
  if (*bad_row < static_cast<int>(gridDim.x)) return;  // a bad label (one block a row)
  const int label = labels[row];
  if (skip_ignored_row(label, row, classes, dlogits, row_loss, row_correct)) return;
  const std::size_t offset = static_cast<std::size_t>(row) * classes;
  const std::uint16_t* z = logits + offset;
  // fn(j, v) for this thread's logits in increasing j: 8 at a time when packed.
  const auto visit = [&](auto&& fn) {
    if (packed) {
      for (int c = threadIdx.x; c < classes / kPack; c += kThreads) {
        const uint4 pack = reinterpret_cast<const uint4*>(z)[c];
        const auto* h = reinterpret_cast<const std::uint16_t*>(&pack);
#pragma unroll
        for (int k = 0; k < kPack; ++k) fn(c * kPack + k, detail::bf16_to_float(h[k]));
      }
    } else {
      for (int j = threadIdx.x; j < classes; j += kThreads) fn(j, detail::bf16_to_float(z[j]));
    }
  };
  __shared__ float zlabel;
  if (threadIdx.x == 0) zlabel = detail::bf16_to_float(z[label]);  // before any write
  OnlineMax mine;
  visit([&](int j, float v) { add_value(mine, v, j); });

  __shared__ float part_m[kThreads];
  __shared__ double part_s[kThreads];
  __shared__ int part_i[kThreads];
  part_m[threadIdx.x] = mine.m, part_s[threadIdx.x] = mine.s, part_i[threadIdx.x] = mine.i;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const unsigned o = threadIdx.x + stride;
      const OnlineMax r = merge({part_m[threadIdx.x], part_s[threadIdx.x], part_i[threadIdx.x]},
                                {part_m[o], part_s[o], part_i[o]});
      part_m[threadIdx.x] = r.m, part_s[threadIdx.x] = r.s, part_i[threadIdx.x] = r.i;
    }
    __syncthreads();
  }
  const float zmax = part_m[0];
  const double sum = part_s[0];
  if (threadIdx.x == 0) {
    row_loss[row] = log(sum) - (double(zlabel) - zmax);  // logsumexp - z[label]
    row_correct[row] = part_i[0] == label ? 1 : 0;
  }
  if (!dlogits) return;
  std::uint16_t* d = dlogits + offset;
  const float inv = static_cast<float>(1.0 / sum);
  const auto grad = [&](int j, float v) {
    return detail::float_to_bf16((expf(v - zmax) * inv - (j == label ? 1.0f : 0.0f)) * grad_scale);
  };
  if (packed) {
    for (int c = threadIdx.x; c < classes / kPack; c += kThreads) {
      const uint4 pack = reinterpret_cast<const uint4*>(z)[c];
      const auto* h = reinterpret_cast<const std::uint16_t*>(&pack);
      uint4 out;
      auto* o = reinterpret_cast<std::uint16_t*>(&out);
#pragma unroll
      for (int k = 0; k < kPack; ++k) o[k] = grad(c * kPack + k, detail::bf16_to_float(h[k]));
      reinterpret_cast<uint4*>(d)[c] = out;
    }
  } else {
    for (int j = threadIdx.x; j < classes; j += kThreads)
      d[j] = grad(j, detail::bf16_to_float(z[j]));
  }
}

// One block: the rows' losses and correct counts, summed in a fixed order, added to *stats
// (nothing after a bad label: the row kernel wrote no row).
__global__ void softmax_xent_total_kernel(const double* row_loss, const int* row_correct,
                                          int rows, const int* bad_row,
                                          LossAccumulator* stats) {
  const int bad = *bad_row;
  double loss = 0.0, correct = 0.0;
  for (int r = threadIdx.x; r < rows && bad >= rows; r += kThreads) {
    loss += row_loss[r];
    correct += row_correct[r];
  }
  loss = block_sum(loss);
  correct = block_sum(correct);  // exact: integers far below 2^53
  if (threadIdx.x == 0) {
    stats->loss_sum += loss;
    stats->correct += static_cast<long long>(correct);
  }
}

// One warp per row of `count` (R, cols) matrices (row = matrix * R + i), row i being position
// cols - R + i of its sequence (R = cols = T: the causal softmax's squares; fewer rows: queries
// against a key/value cache): p[j] = softmax over j <= last = cols - R + i of scale * s[j], 0
// past it. p may alias s: each lane reads its own elements of the row, and writes them only in
// the last pass, after its last read. __fmul_rn keeps scale * s a rounded product (no fused
// multiply-add), as on the CPU. P: the storage of p (float, or bf16 rounded from the fp32
// quotient).
template <class P>
__global__ void causal_softmax_forward_kernel(const float* s, P* p, std::size_t rows, int R,
                                              int cols, float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const int last = cols - R + static_cast<int>(row % static_cast<std::size_t>(R));
  const float* sr = s + row * cols;
  P* pr = p + row * cols;
  float zmax = -INFINITY;
  for (int j = lane(); j <= last; j += kWarp) zmax = fmaxf(zmax, __fmul_rn(scale, sr[j]));
  zmax = warp_max(zmax);
  double sum = 0.0;
  for (int j = lane(); j <= last; j += kWarp) sum += expf(__fmul_rn(scale, sr[j]) - zmax);
  const float inv = static_cast<float>(1.0 / warp_sum(sum));
  for (int j = lane(); j < cols; j += kWarp)
    detail::store_value(&pr[j], j <= last ? expf(__fmul_rn(scale, sr[j]) - zmax) * inv : 0.0f);
}

// One warp per row: ds[j] = scale * p[j] * (dp[j] - sum over j' <= i of p[j'] dp[j']), the sum
// in double; 0 above the diagonal. ds may alias dp (same lane, read before write). P, DS: the
// storage of p and ds (float, or bf16: p widened as read, ds rounded as written).
template <class P, class DS>
__global__ void causal_softmax_backward_kernel(const P* p, const float* dp, DS* ds,
                                               std::size_t rows, int T, float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const int i = static_cast<int>(row % static_cast<std::size_t>(T));
  const P* pr = p + row * T;
  const float* dpr = dp + row * T;
  DS* dsr = ds + row * T;
  double dot = 0.0;
  for (int j = lane(); j <= i; j += kWarp) dot += double(detail::load_value(pr[j])) * dpr[j];
  const float d = static_cast<float>(warp_sum(dot));
  for (int j = lane(); j < T; j += kWarp)
    detail::store_value(&dsr[j], j <= i ? scale * detail::load_value(pr[j]) * (dpr[j] - d) : 0.0f);
}

// One warp per row of the (B, H, T, T) scores: the keys j < i - positions[b][i] get -inf.
__global__ void mask_packed_scores_kernel(float* s, const std::int32_t* positions,
                                          std::size_t rows, int heads, int T) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const int i = static_cast<int>(row % static_cast<std::size_t>(T));
  const std::size_t b = row / static_cast<std::size_t>(T) / static_cast<std::size_t>(heads);
  const int first = i - positions[b * static_cast<std::size_t>(T) + i];
  float* sr = s + row * T;
  for (int j = lane(); j < first; j += kWarp) sr[j] = -INFINITY;
}

// One warp per row (b, i) of the (B, 1, T, T) bias: 0 (bf16 0x0000) on the keys the row's
// sequence lets it read, -inf (bf16 0xFF80) on every other.
__global__ void packed_attention_bias_kernel(std::uint16_t* bias, const std::int32_t* positions,
                                             std::size_t rows, int T) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const int i = static_cast<int>(row % static_cast<std::size_t>(T));
  const int first = i - positions[row];
  std::uint16_t* br = bias + row * T;
  for (int j = lane(); j < T; j += kWarp)
    br[j] = j >= first && j <= i ? std::uint16_t{0x0000} : std::uint16_t{0xFF80};
}

}  // namespace

void launch_packed_attention_bias(cudaStream_t stream, std::uint16_t* bias,
                                  const std::int32_t* positions, int batch, int T) {
  const std::size_t rows = static_cast<std::size_t>(batch) * T;
  if (rows == 0) return;
  packed_attention_bias_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(bias, positions,
                                                                               rows, T);
  CUDA_CHECK(cudaGetLastError());
}

void launch_mask_packed_scores(cudaStream_t stream, float* s, const std::int32_t* positions,
                               int batch, int heads, int T) {
  const std::size_t rows = static_cast<std::size_t>(batch) * heads * T;
  if (rows == 0) return;
  mask_packed_scores_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(s, positions, rows,
                                                                            heads, T);
  CUDA_CHECK(cudaGetLastError());
}

// L, D: the storages of the logits and dlogits; bf16 logits take the fused classifier.
template <class L, class D>
void softmax_cross_entropy_of(cudaStream_t stream, const L* logits, const std::int32_t* labels,
                              int rows, int classes, D* dlogits, float grad_scale,
                              double* row_loss, int* row_correct, LossAccumulator* stats,
                              int first_row) {
  if (rows <= 0) return;
  // The call's first bad row, in the scratch int after the rows' correct counts: it starts above
  // any row (0x7f7f7f7f) and check_labels_kernel lowers it with atomicMin.
  int* bad_row = row_correct + rows;
  CUDA_CHECK(cudaMemsetAsync(bad_row, 0x7f, sizeof(int), stream));
  check_labels_kernel<<<1, kThreads, 0, stream>>>(labels, rows, classes, first_row, bad_row,
                                                  stats);
  CUDA_CHECK(cudaGetLastError());
  if constexpr (std::is_same_v<L, std::uint16_t>) {
    static_assert(std::is_same_v<D, std::uint16_t>);
    const bool packed = classes % kPack == 0 && aligned16(logits, dlogits);  // null is aligned
    fused_classifier_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, labels, classes, packed, dlogits, grad_scale, row_loss, row_correct, bad_row);
  } else {
    softmax_xent_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, labels, classes, dlogits, grad_scale, row_loss, row_correct, bad_row);
  }
  CUDA_CHECK(cudaGetLastError());
  softmax_xent_total_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_correct, rows, bad_row,
                                                        stats);
  CUDA_CHECK(cudaGetLastError());
}

template <class P>
void causal_softmax_forward_of(cudaStream_t stream, const float* s, P* p, int count, int R,
                               int cols, float scale) {
  const std::size_t rows = static_cast<std::size_t>(count) * static_cast<std::size_t>(R);
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(s, p, rows, R,
                                                                                cols, scale);
  CUDA_CHECK(cudaGetLastError());
}

template <class P, class DS>
void causal_softmax_backward_of(cudaStream_t stream, const P* p, const float* dp, DS* ds,
                                int count, int T, float scale) {
  const std::size_t rows = static_cast<std::size_t>(count) * static_cast<std::size_t>(T);
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(p, dp, ds, rows,
                                                                                 T, scale);
  CUDA_CHECK(cudaGetLastError());
}

void launch_softmax_cross_entropy(cudaStream_t stream, const float* logits,
                                  const std::int32_t* labels, int rows, int classes,
                                  float* dlogits, float grad_scale, double* row_loss,
                                  int* row_correct, LossAccumulator* stats, int first_row) {
  softmax_cross_entropy_of(stream, logits, labels, rows, classes, dlogits, grad_scale, row_loss,
                           row_correct, stats, first_row);
}

void launch_softmax_cross_entropy_bf16(cudaStream_t stream, const float* logits,
                                       const std::int32_t* labels, int rows, int classes,
                                       std::uint16_t* dlogits, float grad_scale,
                                       double* row_loss, int* row_correct,
                                       LossAccumulator* stats, int first_row) {
  softmax_cross_entropy_of(stream, logits, labels, rows, classes, dlogits, grad_scale, row_loss,
                           row_correct, stats, first_row);
}

void launch_fused_classifier(cudaStream_t stream, const std::uint16_t* logits,
                             const std::int32_t* labels, int rows, int classes,
                             std::uint16_t* dlogits, float grad_scale, double* row_loss,
                             int* row_correct, LossAccumulator* stats, int first_row) {
  softmax_cross_entropy_of(stream, logits, labels, rows, classes, dlogits, grad_scale, row_loss,
                           row_correct, stats, first_row);
}

void launch_causal_softmax_forward(cudaStream_t stream, const float* s, float* p, int count,
                                   int T, float scale) {
  causal_softmax_forward_of(stream, s, p, count, T, T, scale);
}

void launch_causal_softmax_tail_forward(cudaStream_t stream, const float* s, float* p, int count,
                                        int rows, int cols, float scale) {
  causal_softmax_forward_of(stream, s, p, count, rows, cols, scale);
}

void launch_causal_softmax_forward_bf16(cudaStream_t stream, const float* s, std::uint16_t* p,
                                        int count, int T, float scale) {
  causal_softmax_forward_of(stream, s, p, count, T, T, scale);
}

void launch_causal_softmax_backward(cudaStream_t stream, const float* p, const float* dp,
                                    float* ds, int count, int T, float scale) {
  causal_softmax_backward_of(stream, p, dp, ds, count, T, scale);
}

void launch_causal_softmax_backward_bf16(cudaStream_t stream, const std::uint16_t* p,
                                         const float* dp, std::uint16_t* ds, int count, int T,
                                         float scale) {
  causal_softmax_backward_of(stream, p, dp, ds, count, T, scale);
}

}  // namespace lockstep::cuda
