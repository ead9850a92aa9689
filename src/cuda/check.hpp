// One macro family for CUDA runtime, cuBLAS and NCCL status codes:
//
//   CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
//   CUBLAS_CHECK(cublasSgemm(handle, ...));
//   NCCL_CHECK(ncclAllReduce(...));
//
// A failure throws lockstep::CudaError naming the call as written, its file and line, and the
// library's own name and description of the status. Nothing here exits the process: the trainer
// catches the error in the failing worker and stops the others (see error.hpp).
//
// Plain C++17, so that .cu files (compiled as C++17) and .cpp files can both include it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace lockstep {

// A CUDA, cuBLAS or NCCL call failed. A run-time failure (exit code 1), not an input error.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace cuda {

// "src/cuda/x.cpp" rather than the build machine's absolute path.
inline const char* source_name(const char* file) {
  const char* p = std::strstr(file, "src/cuda/");
  return p ? p : file;
}

[[noreturn]] inline void throw_error(const char* call, const char* file, int line,
                                     const std::string& status) {
  throw CudaError(std::string(call) + " failed at " + source_name(file) + ":" +
                  std::to_string(line) + ": " + status);
}

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear it, so a later launch check does not report it again
  throw_error(call, file, line,
              std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
}

inline void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_error(call, file, line,
              std::string(cublasGetStatusName(status)) + ": " + cublasGetStatusString(status));
}

inline void check(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess) return;
  std::string what = ncclGetErrorString(status);
  const char* detail = ncclGetLastError(nullptr);
  if (detail && *detail) what += std::string(" (") + detail + ")";
  throw_error(call, file, line, what);
}

}  // namespace cuda
}  // namespace lockstep

#define CUDA_CHECK(call) \
  ::lockstep::cuda::check(static_cast<cudaError_t>(call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) \
  ::lockstep::cuda::check(static_cast<cublasStatus_t>(call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) \
  ::lockstep::cuda::check(static_cast<ncclResult_t>(call), #call, __FILE__, __LINE__)
