// The host-side logic of the CUDA device's cuBLASLt products (src/cuda/cublaslt.hpp), which
// runs without a GPU: which answers are refusals to fall back on and which are errors, and what
// a cached plan is keyed by; and, on a GPU, the partly fused input gradient. Built with the CUDA
// backend only.
#include <doctest/doctest.h>

#include <cstdint>

#include "../linear_cases.hpp"
#include "cuda/cublaslt.hpp"
#include "gpu_vs_cpu.hpp"

using namespace lockstep::cuda;

TEST_CASE("cuBLASLt answers: only 'not supported' and no heuristic result are refusals") {
  CHECK(heuristic_answer(CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_SUCCESS) == LtAnswer::run);
  CHECK(heuristic_answer(CUBLAS_STATUS_NOT_SUPPORTED, 0, CUBLAS_STATUS_SUCCESS) ==
        LtAnswer::refused);
  CHECK(heuristic_answer(CUBLAS_STATUS_SUCCESS, 0, CUBLAS_STATUS_SUCCESS) == LtAnswer::refused);
  CHECK(heuristic_answer(CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_NOT_SUPPORTED) ==
        LtAnswer::refused);
  // A bad descriptor is our bug, not a missing kernel: it must throw, not fall back.
  CHECK(heuristic_answer(CUBLAS_STATUS_INVALID_VALUE, 0, CUBLAS_STATUS_SUCCESS) ==
        LtAnswer::error);
  CHECK(heuristic_answer(CUBLAS_STATUS_NOT_INITIALIZED, 0, CUBLAS_STATUS_SUCCESS) ==
        LtAnswer::error);
  CHECK(heuristic_answer(CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_INVALID_VALUE) ==
        LtAnswer::error);
  CHECK(matmul_answer(CUBLAS_STATUS_SUCCESS) == LtAnswer::run);
  CHECK(matmul_answer(CUBLAS_STATUS_NOT_SUPPORTED) == LtAnswer::refused);
  CHECK(matmul_answer(CUBLAS_STATUS_INVALID_VALUE) == LtAnswer::error);
  CHECK(matmul_answer(CUBLAS_STATUS_EXECUTION_FAILED) == LtAnswer::error);
  CHECK(matmul_answer(CUBLAS_STATUS_ARCH_MISMATCH) == LtAnswer::error);
}

TEST_CASE("cuBLASLt plans: keyed by shape, types, epilogue and alignment, not by address") {
  alignas(256) static std::uint16_t buffer[4096];
  LtProblem p;
  p.m = 2304, p.n = 8192, p.k = 768, p.lda = 768, p.ldb = 768, p.ldd = 2304;
  p.ta = CUBLAS_OP_T;
  p.ab_type = CUDA_R_16BF, p.d_type = CUDA_R_16BF;
  p.a = buffer, p.b = buffer + 1024, p.d = buffer + 2048;
  p.epilogue = CUBLASLT_EPILOGUE_BIAS;
  p.bias = buffer + 3072, p.bias_type = CUDA_R_16BF;
  const LtKey key = lt_key(p, false);

  LtProblem moved = p;  // other buffers, as aligned: the same plan
  moved.a = buffer + 128, moved.b = buffer + 256, moved.d = buffer + 384, moved.bias = buffer + 512;
  CHECK(lt_key(moved, false) == key);

  const auto differs = [&](auto change) {
    LtProblem q = p;
    change(q);
    return lt_key(q, false) != key;
  };
  CHECK(differs([](LtProblem& q) { q.n = 4096; }));
  CHECK(differs([](LtProblem& q) { q.bias_type = CUDA_R_32F; }));
  CHECK(differs([](LtProblem& q) { q.d_type = CUDA_R_32F; }));
  CHECK(differs([](LtProblem& q) { q.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }));
  CHECK(differs([](LtProblem& q) { q.beta = 1.0f; }));
  CHECK(differs([&](LtProblem& q) { q.b = buffer + 1; }));      // 2-byte aligned
  CHECK(differs([&](LtProblem& q) { q.bias = buffer + 3073; }));
  CHECK(differs([](LtProblem& q) { q.bias = nullptr; }));
  CHECK(lt_key(p, true) != key);  // TF32
}

// The partly fused input gradient, which runs where cuBLASLt refuses DGELU_BGRAD: the DGELU
// epilogue, then the bias_grad kernel over the gradient it wrote (bf16 when rounded), against
// the CPU's composition. Skips without a GPU.
TEST_SUITE("cuda") {
  TEST_CASE("cuda: input gradient as DGELU and the bias_grad kernel against the CPU device") {
    using namespace lockstep;
    using namespace lockstep::test;
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    LtLinear lt(/*fuse_gelu=*/true);  // this thread's current device is the GPU's
    const LinearCase c(300, 768, 3072, 77);
    for (const bool bf16 : {false, true}) {
      CAPTURE(bf16);
      compare(*gpu, [&](Device& d) {
        const std::size_t n = std::size_t(c.rows) * c.in;
        Matrix w(d, c.weight, bf16), g(d, c.dy, bf16), pre(d, c.pre, bf16), x(d, c.x, bf16);
        DeviceArray<float> dy = on_device(d, c.dy), dw = on_device(d, c.dweight),
                           dbp = on_device(d, c.dbias_pre),
                           dx = on_device(d, std::vector<float>(n));
        DeviceArray<std::uint16_t> dx16(d, bf16 ? n : 0);
        const LinearBackward b{.rows = c.rows, .in = c.in, .out = c.out, .x = x.in(),
                               .weight = w.in(), .dy = dy.data(),
                               .g = bf16 ? g.in() : MatIn{dy.data(), nullptr},
                               .dweight = dw.data(), .dx = dx.data(),
                               .act = FusedActivation::gelu, .pre = pre.in(),
                               .dx_bf16 = dx16.data(), .dbias_pre = dbp.data()};
        if (d.backend() == "cuda") {
          REQUIRE(lt.input_grad(b, d.queue().cuda_stream, /*bias_epilogue=*/false));
          d.synchronize();
        } else {
          d.linear_backward(b);
        }
        Outputs out{bf16 ? widened(dx16.download()) : dx.download(), dbp.download()};
        return out;
      }, linear_tolerance(/*gelu=*/true, bf16, std::max(c.rows, c.out), c.in));
    }
  }
}
