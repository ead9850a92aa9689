// The CPU device: host memory, kernels on a private oneTBB arena, GEMM through OpenBLAS.
//
// Invariants:
//  - Results are bit-identical for identical inputs whatever the arena's size and however TBB
//    schedules the work. Elementwise kernels compute every element on its own; reductions and
//    GEMM split the work into blocks whose bounds depend on the shape alone, and reductions
//    combine the per-block partials in block order.
//  - OpenBLAS runs single-threaded (set once, process-wide); the arena supplies the parallelism.
//  - A single block runs on the calling thread without entering the arena.
//  - The queue is the calling thread: every kernel has finished when it returns.
#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "common/elementwise_math.hpp"
#include "common/gemm_shape.hpp"
#include "common/random.hpp"
#include "lockstep/device.hpp"

namespace lockstep {
namespace {

constexpr std::size_t kGrain = 16384;   // elements per block (elementwise and reductions)
constexpr std::size_t kAlignment = 64;  // bytes, for allocate()
constexpr int kGemmRowBlock = 64;       // fewest rows of C per sgemm call in a row-blocked GEMM
constexpr int kGemmBlocks = 8;          // a row-blocked GEMM has at most about this many blocks
constexpr std::uint64_t kGemmBlockedAbove = std::uint64_t{1} << 20;  // m * n * k

std::size_t blocks_of(std::size_t n, std::size_t block) { return (n + block - 1) / block; }
// Rows of a (rows, cols) matrix per block: about kGrain elements.
std::size_t rows_per_block(std::size_t cols) {
  return std::max<std::size_t>(1, kGrain / std::max<std::size_t>(1, cols));
}

using detail::check_gemm_shape;

class CpuDevice final : public Device {
 public:
  CpuDevice(int id, int threads) : id_(id), arena_(threads) {}

  std::string_view backend() const noexcept override { return "cpu"; }
  int id() const noexcept override { return id_; }

  // ---- Memory ---------------------------------------------------------------------------------

  void* allocate(std::size_t bytes) override {
    const std::size_t size = std::max(kAlignment, blocks_of(bytes, kAlignment) * kAlignment);
    void* p = ::operator new(size, std::align_val_t{kAlignment});
    std::memset(p, 0, size);
    return p;
  }
  void deallocate(void* ptr) noexcept override {
    ::operator delete(ptr, std::align_val_t{kAlignment});
  }
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override {
    copy(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    copy(host_dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}

  // ---- Elementwise ----------------------------------------------------------------------------

  void fill(float* x, float value, std::size_t n) override {
    for_range(n, [&](std::size_t i0, std::size_t i1) { std::fill(x + i0, x + i1, value); });
  }

  void scale(float* x, float alpha, std::size_t n) override {
    for_range(n, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) x[i] *= alpha;
    });
  }

  // y (rows, cols) += bias (cols)
  void add_bias(float* y, const float* bias, int rows, int cols) override {
    const std::size_t nc = static_cast<std::size_t>(cols), nr = static_cast<std::size_t>(rows);
    const std::size_t block = rows_per_block(nc);
    for_blocks(blocks_of(nr, block), [&](std::size_t b) {
      for (std::size_t r = b * block; r < std::min(nr, (b + 1) * block); ++r)
        for (std::size_t c = 0; c < nc; ++c) y[r * nc + c] += bias[c];
    });
  }

  void activation_forward(Activation f, const float* x, float* y, std::size_t n) override {
    switch (f) {
      case Activation::relu: return map(x, y, n, [](float v) { return detail::relu(v); });
      case Activation::tanh: return map(x, y, n, [](float v) { return detail::tanh_act(v); });
      case Activation::gelu: return map(x, y, n, [](float v) { return detail::gelu(v); });
    }
    throw std::invalid_argument("activation_forward: unknown activation");
  }

  void activation_backward(Activation f, const float* x, const float* dy, float* dx,
                           std::size_t n) override {
    switch (f) {
      case Activation::relu:
        return map_grad(x, dy, dx, n, [](float v) { return detail::relu_grad(v); });
      case Activation::tanh:
        return map_grad(x, dy, dx, n, [](float v) { return detail::tanh_grad(v); });
      case Activation::gelu:
        return map_grad(x, dy, dx, n, [](float v) { return detail::gelu_grad(v); });
    }
    throw std::invalid_argument("activation_backward: unknown activation");
  }

  // ---- GEMM -----------------------------------------------------------------------------------

  // C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C. Large products run one sgemm per
  // block of rows of C; the blocking depends on the shape only.
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
    check_gemm_shape("gemm", ta, tb, m, n, k, lda, ldb, ldc);
    if (m == 0 || n == 0) return;
    const auto sgemm = [&](int row0, int rows) {
      // Row `row0` of op(A) starts at a + row0 * lda when A is (m, k), at a + row0 when (k, m).
      const std::size_t r0 = static_cast<std::size_t>(row0);
      cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans,
                  rows, n, k, alpha, a + (at ? r0 : r0 * lda), lda, b, ldb, beta, c + r0 * ldc,
                  ldc);
    };
    const std::uint64_t work = std::uint64_t(m) * std::uint64_t(n) * std::uint64_t(k);
    if (work <= kGemmBlockedAbove) return sgemm(0, m);
    // Each call packs all of op(B) again: blocks of at least kGemmRowBlock rows, and no more
    // than about kGemmBlocks of them (rows rounded up to a multiple of 16), keep that in check.
    const int rows = std::max(kGemmRowBlock, (m + 16 * kGemmBlocks - 1) / (16 * kGemmBlocks) * 16);
    for_blocks(blocks_of(m, rows), [&](std::size_t blk) {
      const int row0 = static_cast<int>(blk) * rows;
      sgemm(row0, std::min(rows, m - row0));
    });
  }

  // ---- Reductions -----------------------------------------------------------------------------

  // dbias (cols) += column sums of dy (rows, cols). Each column is summed over the rows in order,
  // in double; columns are split into fixed blocks.
  void bias_grad(float* dbias, const float* dy, int rows, int cols) override {
    constexpr std::size_t kCols = 64;
    const std::size_t nc = static_cast<std::size_t>(cols), nr = static_cast<std::size_t>(rows);
    const auto columns = [&](std::size_t c0, std::size_t c1) {
      double acc[kCols];
      for (std::size_t c = c0; c < c1; ++c) acc[c - c0] = dbias[c];
      for (std::size_t r = 0; r < nr; ++r)
        for (std::size_t c = c0; c < c1; ++c) acc[c - c0] += dy[r * nc + c];
      for (std::size_t c = c0; c < c1; ++c) dbias[c] = static_cast<float>(acc[c - c0]);
    };
    if (nr * nc <= kGrain) {
      for (std::size_t c0 = 0; c0 < nc; c0 += kCols) columns(c0, std::min(nc, c0 + kCols));
      return;
    }
    for_blocks(blocks_of(nc, kCols),
               [&](std::size_t b) { columns(b * kCols, std::min(nc, (b + 1) * kCols)); });
  }

  // logits (rows, classes), labels (rows), dlogits (rows, classes) or null.
  LossStats softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                  int classes, float* dlogits, float grad_scale) override {
    if (rows < 0 || classes < 1)
      throw std::invalid_argument(
          fmt::format("softmax_cross_entropy: bad shape rows={} classes={}", rows, classes));
    for (int r = 0; r < rows; ++r)
      if (labels[r] < 0 || labels[r] >= classes)
        throw std::out_of_range(fmt::format(
            "softmax_cross_entropy: label {} of row {} is outside [0, {})", labels[r], r, classes));
    const std::size_t nc = static_cast<std::size_t>(classes);
    const auto rows_loss = [&](std::size_t r0, std::size_t r1) {
      LossStats s;
      for (std::size_t r = r0; r < r1; ++r) {
        const float* z = logits + r * nc;
        const std::size_t label = static_cast<std::size_t>(labels[r]);
        std::size_t argmax = 0;
        for (std::size_t j = 1; j < nc; ++j)
          if (z[j] > z[argmax]) argmax = j;
        const double zmax = z[argmax];
        double sum = 0.0;
        for (std::size_t j = 0; j < nc; ++j) sum += std::exp(z[j] - zmax);
        s.loss_sum += std::log(sum) - (z[label] - zmax);  // logsumexp - z[label]
        s.correct += argmax == label ? 1 : 0;
        if (!dlogits) continue;
        float* d = dlogits + r * nc;
        for (std::size_t j = 0; j < nc; ++j) {
          const double p = std::exp(z[j] - zmax) / sum - (j == label ? 1.0 : 0.0);
          d[j] = static_cast<float>(p * grad_scale);
        }
      }
      return s;
    };
    return reduce_blocks<LossStats>(
        static_cast<std::size_t>(rows), rows_per_block(nc), rows_loss,
        [](LossStats acc, const LossStats& s) {
          acc.loss_sum += s.loss_sum;
          acc.correct += s.correct;
          return acc;
        });
  }

  double sum_squares(const float* x, std::size_t n) override {
    return reduce_blocks<double>(
        n, kGrain,
        [&](std::size_t i0, std::size_t i1) {
          double s = 0.0;
          for (std::size_t i = i0; i < i1; ++i) s += double(x[i]) * double(x[i]);
          return s;
        },
        [](double acc, double s) { return acc + s; });
  }

  // n + sum over i of mix64(bits(x[i]) ^ mix64(i)), mod 2^64: exactly associative.
  std::uint64_t hash(const float* x, std::size_t n) override {
    return n + reduce_blocks<std::uint64_t>(
                   n, kGrain,
                   [&](std::size_t i0, std::size_t i1) {
                     std::uint64_t h = 0;
                     for (std::size_t i = i0; i < i1; ++i)
                       h += detail::mix64(std::bit_cast<std::uint32_t>(x[i]) ^ detail::mix64(i));
                     return h;
                   },
                   [](std::uint64_t acc, std::uint64_t h) { return acc + h; });
  }

  // ---- Optimisers -----------------------------------------------------------------------------

  void sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                float* momentum_buf, std::size_t n) override {
    if (opt.momentum != 0.0f && !momentum_buf)
      throw std::invalid_argument("sgd_step: momentum needs a momentum buffer");
    const detail::SgdScalars s{lr, opt.momentum, opt.weight_decay, opt.nesterov};
    // By value: a float captured by reference might alias params[i] as far as GCC knows, which
    // would keep it from hoisting the branches out of the loop and vectorising it.
    for_range(n, [=](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) detail::sgd_update(s, params, grads, momentum_buf, i);
    });
  }

  void adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                  const float* grads, float* m, float* v, std::size_t n) override {
    if (t < 1) throw std::invalid_argument(fmt::format("adamw_step: step {} < 1", t));
    const detail::AdamWScalars s =
        detail::adamw_scalars(opt.beta1, opt.beta2, opt.eps, opt.weight_decay, lr, t);
    for_range(n, [=](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) detail::adamw_update(s, params, grads, m, v, i);
    });
  }

  // ---- Transformer kernels ----------------------------------------------------------------------

  void add(const float* a, const float* b, float* y, std::size_t n) override {
    for_range(n, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
    });
  }

  // One unblocked sgemm per matrix, the matrices spread over the arena; a single matrix goes
  // through gemm() and its row blocking. Either way the split depends on the shape only.
  void gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    int lda, std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b,
                    float beta, float* c, int ldc, std::int64_t stride_c, int count) override {
    if (count < 0) throw std::invalid_argument(fmt::format("gemm_batched: count {} < 0", count));
    if (count == 1) return gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
    check_gemm_shape("gemm_batched", ta, tb, m, n, k, lda, ldb, ldc);
    if (m == 0 || n == 0) return;
    for_blocks(static_cast<std::size_t>(count), [&](std::size_t i) {
      const auto s = static_cast<std::int64_t>(i);
      cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans,
                  m, n, k, alpha, a + s * stride_a, lda, b + s * stride_b, ldb, beta,
                  c + s * stride_c, ldc);
    });
  }

  // out (B, T, C) = wte[ids] + wpe[t], a block of rows at a time.
  void embedding_forward(const float* ids, const float* wte, const float* wpe, float* out,
                         int batch, int T, int C) override {
    const std::size_t nc = static_cast<std::size_t>(C), rows = std::size_t(batch) * T;
    const std::size_t block = rows_per_block(nc);
    for_blocks(blocks_of(rows, block), [&](std::size_t blk) {
      for (std::size_t r = blk * block; r < std::min(rows, (blk + 1) * block); ++r) {
        const float* tok = wte + static_cast<std::size_t>(ids[r]) * nc;
        const float* pos = wpe + (r % static_cast<std::size_t>(T)) * nc;
        for (std::size_t c = 0; c < nc; ++c) out[r * nc + c] = tok[c] + pos[c];
      }
    });
  }

  // Deterministic without atomics: each block of channels walks every position in order, so a
  // token's rows are summed in position order whatever the arena.
  void embedding_backward(const float* ids, const float* dout, float* dwte, float* dwpe,
                          int batch, int T, int C) override {
    constexpr std::size_t kCols = 64;
    const std::size_t nc = static_cast<std::size_t>(C), nt = static_cast<std::size_t>(T);
    const std::size_t rows = static_cast<std::size_t>(batch) * nt;
    for_blocks(blocks_of(nc, kCols), [&](std::size_t blk) {
      const std::size_t c0 = blk * kCols, c1 = std::min(nc, c0 + kCols);
      for (std::size_t r = 0; r < rows; ++r) {
        float* tok = dwte + static_cast<std::size_t>(ids[r]) * nc;
        float* pos = dwpe + (r % nt) * nc;
        const float* d = dout + r * nc;
        for (std::size_t c = c0; c < c1; ++c) {
          tok[c] += d[c];
          pos[c] += d[c];
        }
      }
    });
  }

  void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                         float* mean, float* rstd, int rows, int C) override {
    const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
    const std::size_t block = rows_per_block(nc);
    for_blocks(blocks_of(nr, block), [&](std::size_t blk) {
      for (std::size_t r = blk * block; r < std::min(nr, (blk + 1) * block); ++r) {
        const float* xr = x + r * nc;
        double sum = 0.0;
        for (std::size_t c = 0; c < nc; ++c) sum += xr[c];
        const double mu = sum / double(nc);
        double var = 0.0;
        for (std::size_t c = 0; c < nc; ++c) var += (xr[c] - mu) * (xr[c] - mu);
        const float m = static_cast<float>(mu);
        const float s = static_cast<float>(1.0 / std::sqrt(var / double(nc) + 1e-5));
        float* yr = y + r * nc;
        for (std::size_t c = 0; c < nc; ++c) yr[c] = (xr[c] - m) * s * weight[c] + bias[c];
        mean[r] = m;
        rstd[r] = s;
      }
    });
  }

  // With xhat = (x - mean) * rstd and g = dy * weight:
  //   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
  //   dweight += sum_r dy * xhat, dbias += sum_r dy (rows in order, per block of columns).
  void layernorm_backward(const float* x, const float* weight, const float* mean,
                          const float* rstd, const float* dy, float* dx, float* dweight,
                          float* dbias, int rows, int C) override {
    constexpr std::size_t kCols = 64;
    const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
    const std::size_t block = rows_per_block(nc);
    for_blocks(blocks_of(nr, block), [&](std::size_t blk) {
      for (std::size_t r = blk * block; r < std::min(nr, (blk + 1) * block); ++r) {
        const float* xr = x + r * nc;
        const float* dyr = dy + r * nc;
        double g_sum = 0.0, gx_sum = 0.0;
        for (std::size_t c = 0; c < nc; ++c) {
          const float g = dyr[c] * weight[c];
          g_sum += g;
          gx_sum += double(g) * ((xr[c] - mean[r]) * rstd[r]);
        }
        const float g_mean = static_cast<float>(g_sum / double(nc));
        const float gx_mean = static_cast<float>(gx_sum / double(nc));
        float* dxr = dx + r * nc;
        for (std::size_t c = 0; c < nc; ++c) {
          const float xhat = (xr[c] - mean[r]) * rstd[r];
          dxr[c] += rstd[r] * (dyr[c] * weight[c] - g_mean - xhat * gx_mean);
        }
      }
    });
    for_blocks(blocks_of(nc, kCols), [&](std::size_t blk) {
      const std::size_t c0 = blk * kCols, c1 = std::min(nc, c0 + kCols);
      double dw[kCols] = {}, db[kCols] = {};
      for (std::size_t r = 0; r < nr; ++r)
        for (std::size_t c = c0; c < c1; ++c) {
          const float d = dy[r * nc + c];
          dw[c - c0] += double(d) * ((x[r * nc + c] - mean[r]) * rstd[r]);
          db[c - c0] += d;
        }
      for (std::size_t c = c0; c < c1; ++c) {
        dweight[c] += static_cast<float>(dw[c - c0]);
        dbias[c] += static_cast<float>(db[c - c0]);
      }
    });
  }

  void causal_softmax_forward(const float* s, float* p, int count, int T,
                              float scale) override {
    for_rows_of_squares(count, T, [&](std::size_t row, std::size_t i, std::size_t nt) {
      const float* sr = s + row * nt;
      float* pr = p + row * nt;
      float zmax = -INFINITY;
      for (std::size_t j = 0; j <= i; ++j) zmax = std::max(zmax, scale * sr[j]);
      double sum = 0.0;
      for (std::size_t j = 0; j <= i; ++j) {
        const float e = std::exp(scale * sr[j] - zmax);
        pr[j] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (std::size_t j = 0; j <= i; ++j) pr[j] *= inv;
      for (std::size_t j = i + 1; j < nt; ++j) pr[j] = 0.0f;
    });
  }

  void causal_softmax_backward(const float* p, const float* dp, float* ds, int count, int T,
                               float scale) override {
    for_rows_of_squares(count, T, [&](std::size_t row, std::size_t i, std::size_t nt) {
      const float* pr = p + row * nt;
      const float* dpr = dp + row * nt;
      float* dsr = ds + row * nt;
      double dot = 0.0;
      for (std::size_t j = 0; j <= i; ++j) dot += double(pr[j]) * dpr[j];
      const float d = static_cast<float>(dot);
      for (std::size_t j = 0; j <= i; ++j) dsr[j] = scale * pr[j] * (dpr[j] - d);
      for (std::size_t j = i + 1; j < nt; ++j) dsr[j] = 0.0f;
    });
  }

 private:
  // Calls fn(row, i, T) for every row of `count` (T, T) matrices, row = matrix * T + i.
  template <class Fn>
  void for_rows_of_squares(int count, int T, const Fn& fn) {
    if (count < 0 || T < 0)
      throw std::invalid_argument(fmt::format("causal softmax: bad shape count={} T={}", count, T));
    const std::size_t nt = static_cast<std::size_t>(T), rows = std::size_t(count) * nt;
    const std::size_t block = rows_per_block(nt);
    for_blocks(blocks_of(rows, block), [&](std::size_t blk) {
      for (std::size_t r = blk * block; r < std::min(rows, (blk + 1) * block); ++r) fn(r, r % nt, nt);
    });
  }

  // Calls fn(b) for every b in [0, count): on the caller when count is 1, else in the arena.
  template <class Fn>
  void for_blocks(std::size_t count, const Fn& fn) {
    if (count <= 1) {
      if (count == 1) fn(std::size_t{0});
      return;
    }
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, 1),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          for (std::size_t b = r.begin(); b != r.end(); ++b) fn(b);
                        });
    });
  }

  // Calls body(i0, i1) over [0, n) in blocks of kGrain.
  template <class Body>
  void for_range(std::size_t n, const Body& body) {
    for_blocks(blocks_of(n, kGrain),
               [&](std::size_t b) { body(b * kGrain, std::min(n, (b + 1) * kGrain)); });
  }

  // combine(...combine(combine(T{}, partial(block 0)), partial(block 1))...), blocks of `block`.
  template <class T, class Partial, class Combine>
  T reduce_blocks(std::size_t n, std::size_t block, const Partial& partial,
                  const Combine& combine) {
    std::vector<T> partials(blocks_of(n, block));
    for_blocks(partials.size(), [&](std::size_t b) {
      partials[b] = partial(b * block, std::min(n, (b + 1) * block));
    });
    T acc{};
    for (const T& p : partials) acc = combine(acc, p);
    return acc;
  }

  // y = f(x) and dx = dy * f'(x), elementwise over n.
  // In place (y == x, dx == dy) the loops name one array rather than two that alias: GCC
  // vectorises a loop over two arrays behind a runtime overlap check, which exact aliasing fails.
  template <class F>
  void map(const float* x, float* y, std::size_t n, F f) {
    for_range(n, [x, y, f](std::size_t i0, std::size_t i1) {
      if (y == x)
        for (std::size_t i = i0; i < i1; ++i) y[i] = f(y[i]);
      else
        for (std::size_t i = i0; i < i1; ++i) y[i] = f(x[i]);
    });
  }
  template <class F>
  void map_grad(const float* x, const float* dy, float* dx, std::size_t n, F fprime) {
    for_range(n, [x, dy, dx, fprime](std::size_t i0, std::size_t i1) {
      if (dx == dy)
        for (std::size_t i = i0; i < i1; ++i) dx[i] *= fprime(x[i]);
      else
        for (std::size_t i = i0; i < i1; ++i) dx[i] = dy[i] * fprime(x[i]);
    });
  }

  int id_;
  tbb::task_arena arena_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int id, int threads) {
  if (threads < 1)
    throw std::invalid_argument(
        fmt::format("cpu:{}: threads must be at least 1, got {}", id, threads));
  static std::once_flag blas_once;
  std::call_once(blas_once, [] { openblas_set_num_threads(1); });
  return std::make_unique<CpuDevice>(id, threads);
}

}  // namespace lockstep
