// Matrix products on the CPU: oneDNN's matmul, or OpenBLAS's sgemm (Note [CPU matrix products]).
//
//   cpu::Matmul mm;                                   // one per device
//   const cpu::GemmCall call{.at = false, .bt = true, .m = 256, .n = 4096, .k = 1024, ...};
//   mm.prepare(call);                                 // on the device's thread
//   mm.run(call, a, b, c);                            // from any thread of its arena
//
// Note [CPU matrix products]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Which library computes a product is decided by the machine, chosen once per process
// (gemm_path()), and by the product's shape, never by a timing, so that every run on a machine
// rounds alike:
//  - oneDNN (dnnl::matmul) by default. It dispatches on the CPU's feature bits (AVX2, AVX-512,
//    AVX512_BF16, AMX), which it reads itself, and it has bf16 kernels with fp32 accumulation.
//    Where the CPU has no bf16 instructions, or oneDNN only a "ref" implementation, bf16
//    products widen their inputs to fp32 and run the fp32 kernel instead: the same sums, and
//    faster than what oneDNN 2.6 offers there (on AVX-512 without AVX512_BF16, gemm:jit's
//    emulation at a third of its fp32 rate; below AVX-512, no bf16 matmul at all).
//  - OpenBLAS when LOCKSTEP_CPU_GEMM=openblas asks for it (to compare the two), and never where
//    OpenBLAS fell back to its generic "Prescott" kernels on a CPU that has AVX2 or AVX-512
//    (issue 16 met that on a VM whose CPU model OpenBLAS 0.3.21 did not know: a seventh of the
//    speed its AVX-512 kernels reach there).
//  - Where oneDNN computes, single products (not batches) of at most kSmallProduct multiply-adds
//    still go to OpenBLAS (unless at its Prescott fallback): oneDNN's call costs as much as such
//    a product (one thread: 32x10x64 at half OpenBLAS's speed, 32x64x64 even, 64x64x64 and up
//    1.5-2x faster; bench/RESULTS.md). The tiled attention's products (64 x 64 x D, tens of
//    thousands per step) go to OpenBLAS likewise (tile_library()): through oneDNN 2.6's gemm:jit
//    on an AVX2 machine, its per-call set-up and buffers took more time than the products.
// Both run single-threaded inside each block of a product; the device's oneTBB arena supplies
// the parallelism (ops/gemm.cpp splits the rows of C by shape alone), as before. oneDNN's
// Debian build threads with OpenMP: each calling thread asks OpenMP for one thread, so that
// oneDNN neither starts a team per worker nor picks a blocking for threads it will not get.
//
// A oneDNN primitive is made per call shape (transposes, sizes, leading dimensions, alpha,
// beta, batch and strides), cached by the device, and made on the device's thread before the
// blocks run. Each worker's warm-up makes those of its forward and backward before step 1
// (Note [Warm-up] in src/train/worker_loop.hpp), so a training step makes none, bar a shorter
// last batch. Each product keeps the summation order of its kernel for a shape; products of the
// same rows at another batch size can differ in the last bit, as they could with OpenBLAS.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace lockstep::cpu {

enum class GemmLibrary { onednn, openblas };

// The process's choice, made on first use (Note [CPU matrix products]).
struct GemmPath {
  GemmLibrary library = GemmLibrary::onednn;
  // "oneDNN 2.6 brg:avx512_core (fp32), brg:avx512_core_bf16 (bf16)" or "OpenBLAS 0.3.21
  // Haswell (fp32)", for `lockstep devices` and the run summary.
  std::string description;
  // Why OpenBLAS was set aside or chosen; empty when there is nothing to say.
  std::string note;
  bool small_on_openblas = false;  // oneDNN, but small single products on OpenBLAS
};

// The largest m n k of a single product that goes to OpenBLAS (Note [CPU matrix products]).
constexpr std::uint64_t kSmallProduct = std::uint64_t{1} << 17;
const GemmPath& gemm_path();
// The library of the tiled attention's (tile, tile) products (Note [Tiled attention] in
// ops/attention.cpp): OpenBLAS wherever small products go to it, since oneDNN's call costs as
// much as such a product; oneDNN where OpenBLAS is at its Prescott fallback.
GemmLibrary tile_library();

// One call of a product, row-major: C (m, n) = alpha op(A) (m, k) op(B) (k, n) + beta C, for
// `count` matrices `stride_*` elements apart. With bf16, A and B hold bf16 (the bits, as
// common/bf16.hpp makes them) and the products accumulate in fp32 into C, which stays fp32.
struct GemmCall {
  bool bf16 = false;
  bool at = false, bt = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  int count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  auto operator<=>(const GemmCall&) const = default;
};

// A device's products, with its cache of oneDNN primitives. prepare() is called on the
// device's thread only; run() of a prepared call from any thread.
class Matmul {
 public:
  // The process's library; another only for a benchmark that compares them.
  explicit Matmul(GemmLibrary library = gemm_path().library);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  void prepare(const GemmCall& call);
  // `a` and `b` are float, or std::uint16_t (bf16) when call.bf16.
  void run(const GemmCall& call, const void* a, const void* b, float* c) const;
  // The oneDNN primitives made so far (a bf16 call widened to fp32 makes one, for its fp32
  // call): for tests of when they are made.
  std::size_t primitives() const noexcept;

 private:
  static GemmCall fp32_of(GemmCall call);  // the call with fp32 inputs
  bool on_openblas(const GemmCall& call) const;
  struct Onednn;
  std::unique_ptr<Onednn> onednn_;  // null when OpenBLAS computes everything
  bool small_on_openblas_ = false;
};

}  // namespace lockstep::cpu
