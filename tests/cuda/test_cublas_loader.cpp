// cuBLAS and cuBLASLt loaded on first use (Note [cuBLAS loaded on first use] in
// src/cuda/cublas_loader.cpp): the `lockstep` binary starts without them, a process maps them
// at its first call, and the forwarded calls answer as the libraries do. Runs without a GPU.
// Built with the CUDA backend only.
#include <doctest/doctest.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#include <fstream>
#include <string>

#include "cli/cli_runner.hpp"

namespace {

// Whether this process has a file whose name contains `name` mapped.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("cuBLAS loads on first use: lockstep starts without it, a process maps it at its first call") {
  // The binary: the dynamic loader's own account of what it loads (LD_DEBUG=libs) names no
  // cuBLAS library for a command that makes no handle.
  const auto r = lockstep::test::run_cli("--version", "LD_DEBUG=libs");
  REQUIRE(r.code == 0);
  CHECK_MESSAGE(r.output.find("calling init: ") != std::string::npos,
                "LD_DEBUG=libs printed nothing to check: " << r.output.substr(0, 400));
  CHECK_MESSAGE(r.output.find("libcublas") == std::string::npos, r.output.substr(0, 4000));

  // This process (one doctest case per process, Note [One case per CTest test]).
  REQUIRE_MESSAGE(!mapped("libcublas"), "cuBLAS was mapped before any call: linked again?");
  int major = -1, minor = -1;
  REQUIRE(cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS);
  CHECK(major == CUBLAS_VER_MAJOR);
  CHECK(minor == CUBLAS_VER_MINOR);
  CHECK(mapped("libcublas.so."));
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) ==
        "CUBLAS_STATUS_NOT_SUPPORTED");

  // cuBLASLt: a host-side descriptor, set and destroyed through the forwarded calls.
  cublasLtMatmulPreference_t preference = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS);
  CHECK(mapped("libcublasLt.so."));
  const std::size_t workspace = 1 << 20;
  CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof workspace) ==
        CUBLAS_STATUS_SUCCESS);
  // A bad attribute size is the library's own refusal, passed back unchanged.
  CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, 1) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulPreferenceDestroy(preference) == CUBLAS_STATUS_SUCCESS);
}
