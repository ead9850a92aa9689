// The host-side logic of the CUDA device's cuBLASLt products (src/cuda/cublaslt.hpp), which
// runs without a GPU: which answers are refusals to fall back on and which are errors, and what
// a cached plan is keyed by. Built with the CUDA backend only.
#include <doctest/doctest.h>

#include <cstdint>

#include "cuda/cublaslt.hpp"

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
