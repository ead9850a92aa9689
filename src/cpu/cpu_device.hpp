// The CPU device: host memory, kernels on a private oneTBB arena, GEMM through oneDNN or OpenBLAS
// (cpu/matmul.hpp, Note [CPU matrix products]). The
// class is declared here; its kernels are defined in src/cpu/ops, one file per op family, named
// as the CUDA kernels' files in src/cuda/ops.
//
// Invariants:
//  - Results are bit-identical for identical inputs whatever the arena's size and however TBB
//    schedules the work. Elementwise kernels compute every element on its own; reductions and
//    GEMM split the work into blocks whose bounds depend on the shape alone, and reductions
//    combine the per-block partials in block order.
//  - oneDNN and OpenBLAS run single-threaded (OpenBLAS set once, process-wide; oneDNN per
//    calling thread); the arena supplies the parallelism.
//  - A single block runs on the calling thread without entering the arena.
//  - The queue is the calling thread: every kernel has finished when it returns. Host syncs
//    are counted where a GPU would wait (Note [Host syncs] in device.hpp), though here they
//    cost nothing: the count guards the GPU path.
//  - Every file of src/cpu is compiled with -fno-trapping-math -fno-math-errno (CMakeLists.txt),
//    without which GCC does not vectorise the elementwise loops.
//  - The hot loops run through vectorized() (ops/isa_dispatch.hpp): compiled for AVX2 and
//    AVX-512 too, chosen at run time, the same values on each (Note [Wide vectors for the CPU
//    kernels]).
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "common/tsan_fork_join.hpp"
#include "cpu/matmul.hpp"
#include "cpu/ops/isa_dispatch.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cpu {

constexpr std::size_t kGrain = 16384;  // elements per block (elementwise and reductions)

inline std::size_t blocks_of(std::size_t n, std::size_t block) { return (n + block - 1) / block; }
// Rows of a (rows, cols) matrix per block: about kGrain elements.
inline std::size_t rows_per_block(std::size_t cols) {
  return std::max<std::size_t>(1, kGrain / std::max<std::size_t>(1, cols));
}

class CpuDevice : public Device {
 public:
  CpuDevice(int id, int threads) : id_(id), arena_(threads) {}

  std::string_view backend() const noexcept override { return "cpu"; }
  int id() const noexcept override { return id_; }
  // The oneDNN primitives its products have made so far (Matmul::primitives), for tests.
  std::size_t gemm_primitives() const noexcept { return matmul_.primitives(); }

  // ---- Memory (cpu_device.cpp) ----------------------------------------------------------------

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void synchronize() override { count_host_sync(); }
  // Note [Downloads]: copies at start(), as memcpy; not a host sync, as a GPU's queued copy is
  // not, so that the CPU counts what a GPU's step would.
  std::unique_ptr<Download> make_download() override;

  // ---- Elementwise (ops/elementwise.cpp) ------------------------------------------------------

  void fill(float* x, float value, std::size_t n) override;
  void scale(float* x, float alpha, std::size_t n) override;
  void add(const float* a, const float* b, float* y, std::size_t n) override;
  void dropout(const float* x, float* y, std::size_t n, std::uint64_t key, float p,
               bool accumulate) override;
  void add_bias(float* y, const float* bias, int rows, int cols) override;
  void bias_grad(float* dbias, const float* dy, int rows, int cols) override;
  void bias_grad(float* dbias, const std::uint16_t* dy, int rows, int cols) override;
  void activation_forward(Activation f, const float* x, float* y, std::size_t n) override;
  void activation_backward(Activation f, const float* x, const float* dy, float* dx,
                           std::size_t n) override;
  void add_bias(const float* x, const std::uint16_t* bias, std::uint16_t* y, int rows,
                int cols) override;
  void activation_forward(Activation f, const std::uint16_t* x, std::uint16_t* y,
                          std::size_t n) override;
  void activation_backward(Activation f, const std::uint16_t* x, const float* dy, float* dx,
                           std::uint16_t* dx_bf16, std::size_t n) override;
  void swiglu_forward(const float* h, float* y, int rows, int F) override;
  void swiglu_forward(const std::uint16_t* h, std::uint16_t* y, int rows, int F) override;
  void swiglu_backward(const float* h, const float* dy, float* dh, int rows, int F) override;
  void swiglu_backward(const std::uint16_t* h, const float* dy, float* dh,
                       std::uint16_t* dh_bf16, int rows, int F) override;

  // ---- Fully connected maps (cpu_device.cpp): the composition of the ops above and below,
  // which defines them (Note [Fused linear] in lockstep/device.hpp) ----------------------------

  void linear_forward(const LinearForward& f) override;
  void linear_backward(const LinearBackward& b) override;

  // ---- bf16 conversions (ops/convert.cpp) ----------------------------------------------------

  void to_bf16(const float* x, std::uint16_t* y, std::size_t n) override;
  void from_bf16(const std::uint16_t* x, float* y, std::size_t n) override;

  // ---- GEMM (ops/gemm.cpp) --------------------------------------------------------------------

  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override;
  void gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    int lda, std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b,
                    float beta, float* c, int ldc, std::int64_t stride_c, int count) override;
  void gemm_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                 const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float beta,
                 float* c, int ldc) override;
  void gemm_batched_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                         const std::uint16_t* a, int lda, std::int64_t stride_a,
                         const std::uint16_t* b, int ldb, std::int64_t stride_b, float beta,
                         float* c, int ldc, std::int64_t stride_c, int count) override;

  // ---- Softmax (ops/softmax.cpp) --------------------------------------------------------------

  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, float* dlogits, float grad_scale, LossStats* stats,
                             int first_row) override;
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override;
  void softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override;
  using Device::softmax_cross_entropy;
  void causal_softmax_forward(const float* s, float* p, int count, int T, float scale) override;
  void causal_softmax_backward(const float* p, const float* dp, float* ds, int count, int T,
                               float scale) override;
  void mask_packed_scores(float* s, const std::int32_t* positions, int batch, int heads,
                          int T) override;
  void causal_softmax_forward(const float* s, std::uint16_t* p, int count, int T,
                              float scale) override;
  void causal_softmax_backward(const std::uint16_t* p, const float* dp, std::uint16_t* ds,
                               int count, int T, float scale) override;
  void causal_softmax_tail_forward(const float* s, float* p, int count, int rows, int cols,
                                   float scale) override;

  // ---- Attention (ops/attention.cpp): tiled, online softmax (Note [Tiled attention]) ----------

  void attention_forward(const AttentionShape& shape, MatIn qkv, MatOut y, float* lse) override;
  void attention_backward(const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                          const float* lse, float* dqkv) override;

  // ---- Reductions (ops/reduce.cpp) ------------------------------------------------------------

  double sum_squares(const float* x, std::size_t n) override;
  void sum_squares_grains(const float* x, std::size_t n, std::size_t grain,
                          double* out) override;
  void step_control(const double* grain_sums, std::size_t grains, double clip_norm,
                    StepControl* control) override;
  std::uint64_t hash(const float* x, std::size_t n) override;

  // ---- Optimisers (ops/optimizer.cpp) ---------------------------------------------------------

  void sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                float* momentum_buf, std::size_t n, const StepControl* control,
                std::uint16_t* params_bf16) override;
  void adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                  const float* grads, float* m, float* v, std::size_t n,
                  const StepControl* control, std::uint16_t* params_bf16) override;

  // ---- Embedding (ops/embedding.cpp) ----------------------------------------------------------

  void embedding_forward(const float* ids, const float* wte, const float* wpe, float* out,
                         int batch, int T, int C, const std::int32_t* positions) override;
  void embedding_forward(const float* ids, const std::uint16_t* wte, const std::uint16_t* wpe,
                         float* out, int batch, int T, int C,
                         const std::int32_t* positions) override;
  void embedding_backward(const float* ids, const float* dout, float* dwte, float* dwpe,
                          int batch, int T, int C, const std::int32_t* positions) override;

  // ---- LayerNorm (ops/layernorm.cpp) ----------------------------------------------------------

  void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                         float* mean, float* rstd, int rows, int C) override;
  void layernorm_forward(const float* x, const float* weight, const float* bias,
                         std::uint16_t* y, float* mean, float* rstd, int rows, int C) override;
  void layernorm_backward(const float* x, const float* weight, const float* mean,
                          const float* rstd, const float* dy, float* dx, float* dweight,
                          float* dbias, int rows, int C) override;
  void residual_layernorm_forward(const float* a, const float* b, float* sum,
                                  const float* weight, const float* bias, float* y, float* mean,
                                  float* rstd, int rows, int C) override;
  void residual_layernorm_forward(const float* a, const float* b, float* sum,
                                  const float* weight, const float* bias, std::uint16_t* y,
                                  float* mean, float* rstd, int rows, int C) override;
  void residual_layernorm_backward(const float* x, const float* weight, const float* mean,
                                   const float* rstd, const float* dy, const float* dresidual,
                                   float* dx, std::uint16_t* dx_bf16, float* dweight,
                                   float* dbias, int rows, int C) override;

  // ---- RMSNorm (ops/layernorm.cpp, Note [RMSNorm]) --------------------------------------------

  void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* weight,
                                float* y, float* rstd, int rows, int C, float eps) override;
  void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* weight,
                                std::uint16_t* y, float* rstd, int rows, int C,
                                float eps) override;
  void residual_rmsnorm_backward(const float* x, const float* weight, const float* rstd,
                                 const float* dy, const float* dresidual, float* dx,
                                 std::uint16_t* dx_bf16, float* dweight, int rows,
                                 int C) override;

  // ---- Rotary embeddings (ops/rope.cpp, Note [RoPE]) ------------------------------------------

  void rope_forward(const RopeShape& shape, const RopeTable& table, float* qkv) override;
  void rope_forward(const RopeShape& shape, const RopeTable& table, std::uint16_t* qkv) override;
  void rope_backward(const RopeShape& shape, const RopeTable& table, float* dqkv,
                     std::uint16_t* dqkv_bf16) override;

 private:
  // gemm() and gemm_batched() for inputs T: float, or std::uint16_t holding bf16 (ops/gemm.cpp).
  template <class T>
  void gemm_of(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const T* a, int lda,
               const T* b, int ldb, float beta, float* c, int ldc);
  template <class T>
  void gemm_batched_of(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const T* a,
                       int lda, std::int64_t stride_a, const T* b, int ldb,
                       std::int64_t stride_b, float beta, float* c, int ldc,
                       std::int64_t stride_c, int count);

  // Calls fn(b) for every b in [0, count): on the caller when count is 1, else in the arena
  // (its fork and join told to TSan: Note [TSan and oneTBB]).
  template <class Fn>
  void for_blocks(std::size_t count, const Fn& fn) {
    if (count <= 1) {
      if (count == 1) fn(std::size_t{0});
      return;
    }
    detail::TsanForkJoin fork_join;
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, 1),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          fork_join.task_begins();
                          for (std::size_t b = r.begin(); b != r.end(); ++b) fn(b);
                          fork_join.task_ends();
                        });
    });
    fork_join.joined();
  }

  // Calls body(i0, i1) over [0, n) in blocks of kGrain.
  template <class Body>
  void for_range(std::size_t n, const Body& body) {
    for_blocks(blocks_of(n, kGrain),
               [&](std::size_t b) { body(b * kGrain, std::min(n, (b + 1) * kGrain)); });
  }

  // Calls row(r) for every row r of a (rows, cols) matrix, in blocks of about kGrain elements,
  // through vectorized() (the kernels' row loops).
  template <class Row>
  void for_rows(std::size_t rows, std::size_t cols, const Row& row) {
    const std::size_t block = rows_per_block(cols);
    for_blocks(blocks_of(rows, block), vectorized([=](std::size_t b) {
      for (std::size_t r = b * block; r < std::min(rows, (b + 1) * block); ++r) row(r);
    }));
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

  // Defined in the one file that uses each: ops/elementwise.cpp, ops/softmax.cpp.
  // For X, Y: float, or std::uint16_t holding bf16.
  template <class X, class Y, class F>
  void map(const X* x, Y* y, std::size_t n, F f);
  template <class X, class F>
  void map_grad(const X* x, const float* dy, float* dx, std::uint16_t* dx_bf16, std::size_t n,
                F fprime);
  template <class B, class Y>
  void add_bias_of(const float* x, const B* bias, Y* y, int rows, int cols);
  template <class G>
  void bias_grad_of(float* dbias, const G* dy, int rows, int cols);
  template <class Fn>
  void for_rows_of_causal(int count, int rows, int cols, const Fn& fn);
  // softmax_cross_entropy for the storages L of the logits and D of dlogits.
  template <class L, class D>
  void softmax_cross_entropy_of(const L* logits, const std::int32_t* labels, int rows,
                                int classes, D* dlogits, float grad_scale, LossStats* stats,
                                int first_row);
  // The fp32 and bf16 forms of layernorm_forward and the causal softmax, for the storage of
  // their outputs Y and P (ops/layernorm.cpp, ops/softmax.cpp); LayerNorm's input is a, or
  // a + b stored into sum when b is not null (Note [Residual LayerNorm]).
  template <class Y>
  void layernorm_forward_of(const float* a, const float* b, float* sum, const float* weight,
                            const float* bias, Y* y, float* mean, float* rstd, int rows, int C);
  // RMSNorm's (ops/layernorm.cpp, Note [RMSNorm]), and the weight and bias gradients both
  // norms share (mean null: RMSNorm's, with no bias).
  template <class Y>
  void rmsnorm_forward_of(const float* a, const float* b, float* sum, const float* weight, Y* y,
                          float* rstd, int rows, int C, float eps);
  void norm_param_grads(const float* x, const float* mean, const float* rstd, const float* dy,
                        float* dweight, float* dbias, int rows, int C);
  // SwiGLU for the storage H of h and y (ops/elementwise.cpp, Note [SwiGLU]).
  template <class H>
  void swiglu_forward_of(const H* h, H* y, int rows, int F);
  template <class H>
  void swiglu_backward_of(const H* h, const float* dy, float* dh, std::uint16_t* dh_bf16,
                          int rows, int F);
  // RoPE's rotation of x in place, Q float or bf16 (ops/rope.cpp, Note [RoPE]).
  template <class Q>
  void rope_rotate_of(const RopeShape& shape, const RopeTable& table, Q* x, float sign,
                      std::uint16_t* x_bf16);
  template <class P>
  void causal_softmax_forward_of(const float* s, P* p, int count, int rows, int cols,
                                 float scale);
  template <class P, class DS>
  void causal_softmax_backward_of(const P* p, const float* dp, DS* ds, int count, int T,
                                  float scale);

  int id_;
  tbb::task_arena arena_;
  Matmul matmul_;  // GEMM's primitives, cached per call shape
  Matmul tiles_{tile_library()};  // the tiled attention's products
};

}  // namespace lockstep::cpu
