// Softmax kernels: the classifier's softmax cross-entropy and the attention's causal softmax,
// forward and backward (CUDA: src/cuda/ops/softmax.cu).
#include "cpu/cpu_device.hpp"
#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "common/gemm_shape.hpp"
#include "cpu/ops/isa_dispatch.hpp"

#include <cmath>
#include <type_traits>
#include <vector>

namespace lockstep::cpu {

// Calls fn(row, last, cols) for every row of `count` (rows, cols) matrices whose row i is
// position cols - rows + i of a sequence (row = matrix * rows + i): it sees columns
// j <= last = cols - rows + i. Square matrices (rows = cols = T) are the causal softmax's; fewer
// rows are the newest positions against a key/value cache's (Note [KV cache] in
// src/model/kv_cache.cpp).
template <class Fn>
void CpuDevice::for_rows_of_causal(int count, int rows, int cols, const Fn& fn) {
  if (count < 0 || rows < 0 || cols < rows)
    throw std::invalid_argument(fmt::format(
        "causal softmax: bad shape count={} rows={} cols={}", count, rows, cols));
  const std::size_t nr = static_cast<std::size_t>(rows), nc = static_cast<std::size_t>(cols);
  const std::size_t all = std::size_t(count) * nr, block = rows_per_block(nc);
  for_blocks(blocks_of(all, block), vectorized([=, &fn](std::size_t blk) {
    for (std::size_t r = blk * block; r < std::min(all, (blk + 1) * block); ++r)
      fn(r, nc - nr + r % nr, nc);
  }));
}

// Note [Fused classifier]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Under bf16 a GPT's LM head writes its logits in bf16 (N, P), and one pass per row computes
// the loss, the correct count and the bf16 logit gradient from them, writing the gradient over
// the logits (the LM head's backward reads it there): one read of the logits and one write,
// where the unfused form writes fp32 logits (4 bytes each; 1.65 GB for GPT-2 at 8 x 1024 rows)
// and reads them again for its softmax. The fp32 values exist only a row at a time (in
// registers on a GPU, in doubles here), never as a copy of the logits. The math is that of
// softmax_cross_entropy on the widened logits: the logits' own rounding to bf16 (2^-9
// relative) is the only difference from the fp32 form, which the tests bound.
// This is the reference: the CUDA kernel (src/cuda/ops/softmax.cu) must match it.

// logits (rows, classes) stored as L (float, or bf16 widened as read), labels (rows), dlogits
// (rows, classes) or null, stored as D (float, or bf16 rounded); dlogits may be the logits
// (each element is read before its own gradient is written). The labels are checked before
// anything is written: a bad one leaves the sums and dlogits alone and is recorded, as of row
// first_row + r of the caller's batch. A row
// labelled kIgnoreLabel adds nothing to the sums and gets a zero gradient.
template <class L, class D>
void CpuDevice::softmax_cross_entropy_of(const L* logits, const std::int32_t* labels,
                                         int rows, int classes, D* dlogits, float grad_scale,
                                         LossStats* stats, int first_row) {
  detail::check_loss_shape(rows, classes);
  for (int r = 0; r < rows; ++r)
    if ((labels[r] < 0 && labels[r] != kIgnoreLabel) || labels[r] >= classes) {
      stats->label_error =
          std::max(stats->label_error, detail::label_error_key(first_row + r, labels[r]));
      return;
    }
  const std::size_t nc = static_cast<std::size_t>(classes);
  const auto rows_loss = [&](std::size_t r0, std::size_t r1) {
    LossStats s;
    for (std::size_t r = r0; r < r1; ++r) {
      const L* row = logits + r * nc;
      if (labels[r] == kIgnoreLabel) {
        if (dlogits)
          for (std::size_t j = 0; j < nc; ++j) detail::store_value(&dlogits[r * nc + j], 0.0f);
        continue;
      }
      const auto z = [row](std::size_t j) { return detail::load_value(row[j]); };
      const std::size_t label = static_cast<std::size_t>(labels[r]);
      std::size_t argmax = 0;
      for (std::size_t j = 1; j < nc; ++j)
        if (z(j) > z(argmax)) argmax = j;
      const double zmax = z(argmax);
      double sum = 0.0;
      for (std::size_t j = 0; j < nc; ++j) sum += std::exp(z(j) - zmax);
      s.loss_sum += std::log(sum) - (z(label) - zmax);  // logsumexp - z[label]
      s.correct += argmax == label ? 1 : 0;
      if (!dlogits) continue;
      D* d = dlogits + r * nc;
      for (std::size_t j = 0; j < nc; ++j) {
        const double p = std::exp(z(j) - zmax) / sum - (j == label ? 1.0 : 0.0);
        detail::store_value(&d[j], static_cast<float>(p * grad_scale));
      }
    }
    return s;
  };
  const LossStats total = reduce_blocks<LossStats>(
      static_cast<std::size_t>(rows), rows_per_block(nc), rows_loss,
      [](LossStats acc, const LossStats& s) {
        acc.loss_sum += s.loss_sum;
        acc.correct += s.correct;
        return acc;
      });
  stats->loss_sum += total.loss_sum;
  stats->correct += total.correct;
}

void CpuDevice::softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                      int classes, float* dlogits, float grad_scale,
                                      LossStats* stats, int first_row) {
  softmax_cross_entropy_of(logits, labels, rows, classes, dlogits, grad_scale, stats, first_row);
}

void CpuDevice::softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                      int classes, std::uint16_t* dlogits, float grad_scale,
                                      LossStats* stats, int first_row) {
  softmax_cross_entropy_of(logits, labels, rows, classes, dlogits, grad_scale, stats, first_row);
}

void CpuDevice::softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels,
                                      int rows, int classes, std::uint16_t* dlogits,
                                      float grad_scale, LossStats* stats, int first_row) {
  softmax_cross_entropy_of(logits, labels, rows, classes, dlogits, grad_scale, stats, first_row);
}

// P: the storage of p. fp32 keeps the exponentials in p itself (which may alias s) until they
// are divided; bf16 keeps them in an fp32 row of the calling thread's, so each probability is
// rounded once, from the fp32 quotient.
template <class P>
void CpuDevice::causal_softmax_forward_of(const float* s, P* p, int count, int rows, int cols,
                                           float scale) {
  for_rows_of_causal(count, rows, cols, [&](std::size_t row, std::size_t i, std::size_t nt) {
    const float* sr = s + row * nt;
    P* pr = p + row * nt;
    float* er;
    if constexpr (std::is_same_v<P, float>) {
      er = pr;
    } else {
      thread_local std::vector<float> exps;
      exps.resize(nt);
      er = exps.data();
    }
    float zmax = -INFINITY;
    for (std::size_t j = 0; j <= i; ++j) zmax = std::max(zmax, scale * sr[j]);
    double sum = 0.0;
    for (std::size_t j = 0; j <= i; ++j) {
      const float e = std::exp(scale * sr[j] - zmax);
      er[j] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::size_t j = 0; j <= i; ++j) detail::store_value(&pr[j], er[j] * inv);
    for (std::size_t j = i + 1; j < nt; ++j) detail::store_value(&pr[j], 0.0f);
  });
}

// P, DS: the storage of p and ds; ds may alias dp when both are fp32.
template <class P, class DS>
void CpuDevice::causal_softmax_backward_of(const P* p, const float* dp, DS* ds, int count, int T,
                                           float scale) {
  for_rows_of_causal(count, T, T, [&](std::size_t row, std::size_t i, std::size_t nt) {
    const P* pr = p + row * nt;
    const float* dpr = dp + row * nt;
    DS* dsr = ds + row * nt;
    double dot = 0.0;
    for (std::size_t j = 0; j <= i; ++j) dot += double(detail::load_value(pr[j])) * dpr[j];
    const float d = static_cast<float>(dot);
    for (std::size_t j = 0; j <= i; ++j)
      detail::store_value(&dsr[j], scale * detail::load_value(pr[j]) * (dpr[j] - d));
    for (std::size_t j = i + 1; j < nt; ++j) detail::store_value(&dsr[j], 0.0f);
  });
}

// Row i of matrix (b, h): the keys before i - positions[b][i] (earlier sequences) get -inf.
void CpuDevice::mask_packed_scores(float* s, const std::int32_t* positions, int batch, int heads,
                                   int T) {
  for_rows_of_causal(batch * heads, T, T, [&](std::size_t row, std::size_t i, std::size_t nt) {
    const std::size_t b = row / nt / static_cast<std::size_t>(heads);
    const std::size_t first = i - static_cast<std::size_t>(positions[b * nt + i]);
    std::fill_n(s + row * nt, first, -INFINITY);
  });
}

void CpuDevice::causal_softmax_forward(const float* s, float* p, int count, int T, float scale) {
  causal_softmax_forward_of(s, p, count, T, T, scale);
}

void CpuDevice::causal_softmax_forward(const float* s, std::uint16_t* p, int count, int T,
                                       float scale) {
  causal_softmax_forward_of(s, p, count, T, T, scale);
}

void CpuDevice::causal_softmax_tail_forward(const float* s, float* p, int count, int rows,
                                            int cols, float scale) {
  causal_softmax_forward_of(s, p, count, rows, cols, scale);
}

void CpuDevice::causal_softmax_backward(const float* p, const float* dp, float* ds, int count,
                                        int T, float scale) {
  causal_softmax_backward_of(p, dp, ds, count, T, scale);
}

void CpuDevice::causal_softmax_backward(const std::uint16_t* p, const float* dp,
                                        std::uint16_t* ds, int count, int T, float scale) {
  causal_softmax_backward_of(p, dp, ds, count, T, scale);
}

}  // namespace lockstep::cpu
