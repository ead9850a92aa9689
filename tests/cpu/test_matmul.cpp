// The CPU's matrix products (src/cpu/matmul.hpp, Note [CPU matrix products]): oneDNN and
// OpenBLAS compute the same products, batched and strided as GPT's attention calls them, and the
// process names its library, which LOCKSTEP_CPU_GEMM can set.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../compare.hpp"
#include "../random_data.hpp"
#include "common/bf16.hpp"
#include "cpu/matmul.hpp"
#include "lockstep/device.hpp"

namespace {

using lockstep::cpu::GemmCall;
using lockstep::cpu::GemmLibrary;
using lockstep::cpu::Matmul;

// C of `call` computed by `library` from the same A, B and C.
std::vector<float> product(GemmLibrary library, const GemmCall& call, std::size_t a_size,
                           std::size_t b_size, std::size_t c_size) {
  const auto a = lockstep::test::random_floats(a_size, 1);
  const auto b = lockstep::test::random_floats(b_size, 2);
  auto c = lockstep::test::random_floats(c_size, 3);
  Matmul mm(library);
  mm.prepare(call);
  mm.run(call, a.data(), b.data(), c.data());
  return c;
}

// max |x - y|, NaN when any difference is.
double largest_difference(const std::vector<float>& x, const std::vector<float>& y) {
  double d = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i)
    d = lockstep::test::worse(d, double(std::abs(x[i] - y[i])));
  return d;
}

}  // namespace

TEST_CASE("matmul: oneDNN and OpenBLAS agree on strided batches, transposes, alpha and beta") {
  // Attention's layout: 4 heads of 8 columns interleaved in rows of 3 x 32 (q, k, v), so the
  // matrices of a batch are 8 floats apart and their rows 96 apart. S (T, T) = Q K^T per head.
  const int T = 16, D = 8, H = 4, ld = 96;
  const GemmCall scores{.bt = true, .m = T, .n = T, .k = D, .lda = ld, .ldb = ld, .ldc = T,
                        .alpha = 0.5f, .beta = 0.0f, .count = H, .stride_a = D, .stride_b = D,
                        .stride_c = T * T};
  const std::size_t qkv = std::size_t(T) * ld, s = std::size_t(H) * T * T;
  const auto onednn = product(GemmLibrary::onednn, scores, qkv, qkv, s);
  CHECK(largest_difference(onednn, product(GemmLibrary::openblas, scores, qkv, qkv, s)) < 1e-5);

  // A weight gradient: dW (out, in) += dY^T (out, rows) X (rows, in), padded leading dimensions.
  const GemmCall dw{.at = true, .m = 33, .n = 21, .k = 40, .lda = 35, .ldb = 22, .ldc = 24,
                    .alpha = 1.0f, .beta = 1.0f};
  const std::size_t a = 40 * 35, b = 40 * 22, c = 33 * 24;
  CHECK(largest_difference(product(GemmLibrary::onednn, dw, a, b, c),
                           product(GemmLibrary::openblas, dw, a, b, c)) < 1e-5);
}

TEST_CASE("matmul: bf16 inputs accumulate in fp32 as the fp32 product of the same values") {
  // op(A) (m, k) transposed, B (k, n); values that bf16 holds exactly, so the fp32 product of the
  // widened values is the reference: only the summation order may differ.
  const GemmCall bf16{.bf16 = true, .at = true, .m = 70, .n = 45, .k = 130, .lda = 70, .ldb = 45,
                      .ldc = 45, .alpha = 1.0f, .beta = 1.0f};
  GemmCall fp32 = bf16;
  fp32.bf16 = false;
  const std::size_t a_size = 130 * 70, b_size = 130 * 45, c_size = 70 * 45;
  // x rounded to bf16: its bits, and the float they stand for.
  const auto to_bf16 = [](const std::vector<float>& x, std::vector<std::uint16_t>& bits,
                          std::vector<float>& values) {
    for (float v : x) {
      bits.push_back(lockstep::detail::float_to_bf16(v));
      values.push_back(lockstep::detail::bf16_to_float(bits.back()));
    }
  };
  std::vector<std::uint16_t> a16, b16;
  std::vector<float> a, b;
  to_bf16(lockstep::test::random_floats(a_size, 7), a16, a);
  to_bf16(lockstep::test::random_floats(b_size, 8), b16, b);
  const auto c0 = lockstep::test::random_floats(c_size, 9);
  const auto run = [&](GemmLibrary library, const GemmCall& call, const void* x, const void* y) {
    std::vector<float> c = c0;
    Matmul mm(library);
    mm.prepare(call);
    mm.run(call, x, y, c.data());
    return c;
  };
  const auto want = run(GemmLibrary::onednn, fp32, a.data(), b.data());
  CHECK(largest_difference(run(GemmLibrary::onednn, bf16, a16.data(), b16.data()), want) < 1e-5);
  // OpenBLAS has no bf16 product: it widens, then runs sgemm.
  CHECK(largest_difference(run(GemmLibrary::openblas, bf16, a16.data(), b16.data()), want) < 1e-5);
}

TEST_CASE("matmul: small single products go to OpenBLAS, unless it runs its Prescott fallback") {
  // 32 x 64 x 64 = 2^17 multiply-adds, the largest that goes to OpenBLAS.
  const GemmCall small{.bt = true, .m = 32, .n = 64, .k = 64, .lda = 64, .ldb = 64, .ldc = 64};
  Matmul mm(GemmLibrary::onednn);
  mm.prepare(small);
  if (lockstep::cpu::gemm_path().small_on_openblas) {
    CHECK(mm.primitives() == 0);  // nothing for oneDNN to prepare
    // OpenBLAS's bits exactly.
    const std::size_t a = 32 * 64, b = 64 * 64, c = 32 * 64;
    CHECK(product(GemmLibrary::onednn, small, a, b, c) ==
          product(GemmLibrary::openblas, small, a, b, c));
  } else {
    // OpenBLAS at its generic kernels on a CPU with AVX2: oneDNN computes every product.
    CHECK(mm.primitives() == 1);
    CHECK(lockstep::cpu::gemm_path().note.find("Prescott") != std::string::npos);
  }
}

TEST_CASE("matmul: a product over k = 0 only scales C by beta") {
  auto dev = lockstep::make_cpu_device(0, 1);
  std::vector<float> c{1.0f, 2.0f, 3.0f, 4.0f};
  const float unused = 0.0f;
  dev->gemm(lockstep::Transpose::no, lockstep::Transpose::no, 2, 2, 0, 1.0f, &unused, 1, &unused,
            2, 0.5f, c.data(), 2);
  CHECK(c == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
}

TEST_CASE("matmul: lockstep devices names the library, and LOCKSTEP_CPU_GEMM picks it or is "
          "refused") {
  using lockstep::test::run_cli;
  const auto chosen = run_cli("devices");
  CHECK(chosen.output.find("matrix products: oneDNN") != std::string::npos);
  const auto openblas = run_cli("devices", "LOCKSTEP_CPU_GEMM=openblas");
  // OpenBLAS unless it runs its generic Prescott kernels on a CPU with AVX2 (then oneDNN).
  CHECK((openblas.output.find("matrix products: OpenBLAS") != std::string::npos ||
         openblas.output.find("matrix products: oneDNN") != std::string::npos));
  // Where oneDNN may not use bf16 instructions (its ISA capped below AVX512_BF16; below
  // AVX-512 it has no bf16 matmul at all), bf16 products widen to fp32, and it still runs.
  for (const char* isa : {"AVX2", "AVX512_CORE"}) {
    CAPTURE(isa);
    const auto capped = run_cli("devices", std::string("ONEDNN_MAX_CPU_ISA=") + isa);
    CHECK(capped.code == 0);
    CHECK(capped.output.find("none, widened to fp32 (bf16)") != std::string::npos);
  }
  const auto bad = run_cli("devices", "LOCKSTEP_CPU_GEMM=mkl");
  CHECK(bad.code == 2);
  CHECK(bad.output.find("LOCKSTEP_CPU_GEMM: expected onednn or openblas, got 'mkl'") !=
        std::string::npos);
}
