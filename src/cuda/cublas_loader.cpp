// cuBLAS and cuBLASLt, loaded on first use: the entry points the backend calls, each forwarding
// to the library's own, which the first call opens with dlopen.
//
// Note [cuBLAS loaded on first use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Linked as a shared library's dependency, libcublasLt runs its initialisers at every start of
// every program that links lockstep, GPU or not: about 54 ms of CPU (measured with `perf stat`
// on a program that links it and does nothing; every other library lockstep links costs under
// 7 ms), 80% of `lockstep --version`, and a serial part of every `lockstep tokenize` and of
// every test process. The backend calls 23 functions of the two libraries, so lockstep links
// neither: this file defines those functions itself, with the headers' own declarations, and
// the first call of each looks the library's function up (dlsym) in the library opened on the
// first call of any (dlopen of libcublas.so.MAJOR or libcublasLt.so.MAJOR, the headers'
// major version). A program that never makes a cuBLAS handle never loads them.
// - Where: the dynamic loader's search, from this object (its RUNPATH, LD_LIBRARY_PATH, the
//   cache), then the directory of the CUDA runtime this program linked, where a toolkit keeps
//   cuBLAS beside it (an installed lockstep or the Python module need not carry the RUNPATH).
// - When a library cannot be opened: every call returns CUBLAS_STATUS_NOT_INITIALIZED, and
//   cublasGetStatusString says why (the loader's message), so CUBLAS_CHECK's error (check.hpp)
//   names the missing library instead of a crash at start.
// - These definitions are hidden (-fvisibility=hidden, and the headers ask for no visibility):
//   they bind the backend's calls and never interpose on the libraries' own symbols.
// - Thread safety: each function's pointer is a function-local static, initialised once; dlopen
//   and dlsym are thread-safe.
// tests/cuda/test_cublas_loader.cpp checks that the libraries are not mapped before the first
// call and are after, and that the forwarded calls answer as the library does.
#include <dlfcn.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>

#define LOCKSTEP_STR2(x) #x
#define LOCKSTEP_STR(x) LOCKSTEP_STR2(x)

namespace lockstep::cuda {
namespace {

struct Library {
  explicit Library(const char* name) : soname(name) {}
  const char* soname;
  void* handle = nullptr;
  std::string error;  // why it could not be opened; empty while it was not tried or opened
  std::once_flag once;
};

Library cublas_library{"libcublas.so." LOCKSTEP_STR(CUBLAS_VER_MAJOR)};
Library cublaslt_library{"libcublasLt.so." LOCKSTEP_STR(CUBLAS_VER_MAJOR)};

// The directory of the CUDA runtime library this program runs with, or empty.
std::filesystem::path runtime_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) == 0 || !info.dli_fname)
    return {};
  return std::filesystem::path(info.dli_fname).parent_path();
}

void* open(Library& lib) {
  std::call_once(lib.once, [&lib] {
    lib.handle = dlopen(lib.soname, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) return;
    std::string first = dlerror();
    if (const std::filesystem::path dir = runtime_directory(); !dir.empty()) {
      lib.handle = dlopen((dir / lib.soname).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle) return;
    }
    lib.error = "cannot load " + std::string(lib.soname) + ": " + first;
  });
  return lib.handle;
}

// What a call returns when its library could not be opened: the status, or for the status
// strings the loader's message (the name: the status's own).
template <class R>
R failure(const Library& lib, std::string_view name) {
  if constexpr (std::is_same_v<R, cublasStatus_t>)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  else
    return name == "cublasGetStatusName" ? "CUBLAS_STATUS_NOT_INITIALIZED" : lib.error.c_str();
}

// Calls the library's `name`, of F's type, with `args`.
template <auto F, class... Args>
auto call(Library& lib, const char* name, Args... args) {
  using Fn = decltype(F);
  using R = std::invoke_result_t<Fn, Args...>;
  static const Fn real = [&]() -> Fn {
    void* handle = open(lib);
    return handle ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
  }();
  if (!real) {
    if (lib.error.empty() && lib.handle) {  // the library opened but lacks the function
      static const std::string missing = std::string(lib.soname) + " has no " + name;
      if constexpr (std::is_same_v<R, cublasStatus_t>)
        return static_cast<R>(CUBLAS_STATUS_NOT_SUPPORTED);
      else
        return static_cast<R>(missing.c_str());
    }
    return failure<R>(lib, name);
  }
  return real(args...);
}

}  // namespace

}  // namespace lockstep::cuda

using lockstep::cuda::call;
using lockstep::cuda::cublas_library;
using lockstep::cuda::cublaslt_library;

extern "C" {

// --- cuBLAS (cublas_api.h) ---

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  return call<&cublasCreate_v2>(cublas_library, "cublasCreate_v2", handle);
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  return call<&cublasDestroy_v2>(cublas_library, "cublasDestroy_v2", handle);
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  return call<&cublasSetStream_v2>(cublas_library, "cublasSetStream_v2", handle, stream);
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  return call<&cublasSetMathMode>(cublas_library, "cublasSetMathMode", handle, mode);
}
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  return call<&cublasGetProperty>(cublas_library, "cublasGetProperty", type, value);
}
const char* cublasGetStatusName(cublasStatus_t status) {
  return call<&cublasGetStatusName>(cublas_library, "cublasGetStatusName", status);
}
const char* cublasGetStatusString(cublasStatus_t status) {
  return call<&cublasGetStatusString>(cublas_library, "cublasGetStatusString", status);
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
  return call<&cublasSgemm_v2>(cublas_library, "cublasSgemm_v2", handle, transa, transb, m, n, k,
                               alpha, A, lda, B, ldb, beta, C, ldc);
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb,
                                         long long int strideB, const float* beta, float* C,
                                         int ldc, long long int strideC, int batchCount) {
  return call<&cublasSgemmStridedBatched>(cublas_library, "cublasSgemmStridedBatched", handle,
                                          transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb,
                                          strideB, beta, C, ldc, strideC, batchCount);
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  // The C declaration's type: C++ also sees a deprecated overload of each.
  using Fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                int, const void*, const void*, cudaDataType, int, const void*,
                                cudaDataType, int, const void*, void*, cudaDataType, int,
                                cublasComputeType_t, cublasGemmAlgo_t);
  return call<static_cast<Fn>(&cublasGemmEx)>(cublas_library, "cublasGemmEx", handle, transa, transb, m, n, k,
                             alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
                             computeType, algo);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                int, const void*, const void*, cudaDataType, int, long long int,
                                const void*, cudaDataType, int, long long int, const void*, void*,
                                cudaDataType, int, long long int, int, cublasComputeType_t,
                                cublasGemmAlgo_t);
  return call<static_cast<Fn>(&cublasGemmStridedBatchedEx)>(
      cublas_library, "cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A,
      Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
      computeType, algo);
}

// --- cuBLASLt (cublasLt.h) ---

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  return call<&cublasLtCreate>(cublaslt_library, "cublasLtCreate", handle);
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  return call<&cublasLtDestroy>(cublaslt_library, "cublasLtDestroy", handle);
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  return call<&cublasLtMatmulDescCreate>(cublaslt_library, "cublasLtMatmulDescCreate", desc,
                                         compute, scale);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return call<&cublasLtMatmulDescDestroy>(cublaslt_library, "cublasLtMatmulDescDestroy", desc);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  return call<&cublasLtMatmulDescSetAttribute>(cublaslt_library,
                                               "cublasLtMatmulDescSetAttribute", desc, attr, buf,
                                               size);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  return call<&cublasLtMatrixLayoutCreate>(cublaslt_library, "cublasLtMatrixLayoutCreate", layout,
                                           type, rows, cols, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return call<&cublasLtMatrixLayoutDestroy>(cublaslt_library, "cublasLtMatrixLayoutDestroy",
                                            layout);
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return call<&cublasLtMatmulPreferenceCreate>(cublaslt_library,
                                               "cublasLtMatmulPreferenceCreate", pref);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return call<&cublasLtMatmulPreferenceDestroy>(cublaslt_library,
                                                "cublasLtMatmulPreferenceDestroy", pref);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  return call<&cublasLtMatmulPreferenceSetAttribute>(
      cublaslt_library, "cublasLtMatmulPreferenceSetAttribute", pref, attr, buf, size);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle,
                                              cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  return call<&cublasLtMatmulAlgoGetHeuristic>(cublaslt_library, "cublasLtMatmulAlgoGetHeuristic",
                                               handle, desc, a, b, c, d, pref, requested, results,
                                               returned);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return call<&cublasLtMatmul>(cublaslt_library, "cublasLtMatmul", handle, desc, alpha, A, Adesc,
                               B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                               workspace_bytes, stream);
}

}  // extern "C"
