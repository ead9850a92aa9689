// Shared by the CUDA tests: the backend or a skip, random inputs, one op run on the GPU and on a
// CPU device with the results compared, and a group of ranks each on its thread.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/random.hpp"
#include "lockstep/lockstep.hpp"
#include "../compare.hpp"
#include "../random_data.hpp"
#include "../skip.hpp"

namespace lockstep::test {

// How a case skips where this build has no CUDA backend: "gpu" on a machine without the CUDA
// toolkit, "unbuilt" (refused by scripts/test.sh) where the configure found nvcc at `toolkit`
// (Note [CUDA toolkit, backend not built] in the top-level CMakeLists.txt).
struct SkipReason {
  Skip kind;
  std::string why;
};
inline SkipReason without_cuda_backend(std::string_view toolkit = LOCKSTEP_TEST_CUDA_TOOLKIT) {
  if (toolkit.empty())
    return {Skip::gpu, "this build has no CUDA backend, and this machine no CUDA toolkit"};
  return {Skip::unbuilt,
          fmt::format("this build has no CUDA backend, but the CUDA toolkit is here ({}): "
                      "configure with it (-DCMAKE_CUDA_COMPILER={} -DLOCKSTEP_WITH_CUDA=ON)",
                      toolkit, toolkit)};
}

// The CUDA backend, or null (after saying why) when this build or this machine has none.
inline std::unique_ptr<Backend> cuda_or_skip(const BackendOptions& options = {}) {
  if (!cuda_support().built) {
    const SkipReason reason = without_cuda_backend();
    skip(reason.kind, reason.why);
    return nullptr;
  }
  try {
    return make_backend(BackendKind::cuda, {}, options);
  } catch (const InputError& e) {
    skip(Skip::gpu, "no usable GPU (" + std::string(e.what()) + ")");
    return nullptr;
  }
}

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Note [Comparing with the CPU]
// Every element on its own: |got - want| <= rel |want| + abs m, m the largest finite |want| of
// the element's row (`row` elements; the whole output when 0). rel and abs come from the dtype:
//   fp32   4 ulps (2^-23 each) per term of the sums behind the value, which each side adds in
//          its own order: fp32_sums(K); an element-wise op has K = 1.
//   bf16   one bf16 ulp (2^-7 of the value, twice bf16's 2^-8 rounding: both sides round, and
//          may land on neighbours) on top of the fp32 tolerance of the value rounded.
//   tf32   one TF32 ulp (2^-10) per term: each operand keeps 10 bits.
// The floor scales with the row's largest value, never the array's: in a causal softmax row 0
// holds p = 1, and a floor scaled by it let whole rows of probabilities below 1/128 go unwritten
// (issue 30). An infinity must be met exactly. NaN in the CPU's output fails, unless the test
// says NaN is expected where the CPU has it (padding both sides must leave alone); the GPU must
// then have NaN there too, and nowhere else. Outputs a kernel overwrites start as NaN
// (poisoned, poisoned_bf16), so that an element never written fails.
// Tolerance, fp32_sums, bf16_rounded, mismatches and check_close: tests/compare.hpp's.
inline constexpr double kTf32Ulp = 0x1p-10;
inline constexpr Tolerance kSameBits{};
constexpr Tolerance tf32_sums(double terms, std::size_t row = 0) {
  return {kTf32Ulp * terms, kTf32Ulp * terms, row};
}
// No floor, for values no cancellation stands behind (a softmax's probabilities, quotients of
// positive sums): each held to its own size.
constexpr Tolerance without_floor(Tolerance t) { return {t.rel, 0.0, t.row, t.whole}; }

// A fused linear layer's outputs (test_cuda_linear.cpp, test_cublaslt_plan.cpp), element by
// element: fp32 sums of `terms` products, the summation order each side's; with GELU also
// cuBLASLt's GELU, computed its own way (its documentation gives no formula; an approximate
// tanh, as the GPU's tanh.approx with about 2^-11 relative error): 2^-10 more, of the value and
// of the row's largest. A bf16 result may round to
// the neighbouring bf16; GELU is applied before pre is rounded, and the bias gradients sum dy
// rounded on each side (Note [Fused linear]): a bf16 ulp of the row's largest more.
inline constexpr double kGeluApproximation = 0x1p-10;

inline Tolerance linear_tolerance(bool gelu, bool bf16, int terms, int row) {
  Tolerance t = fp32_sums(terms + 4, static_cast<std::size_t>(row));
  if (gelu) t = {t.rel + kGeluApproximation, t.abs + kGeluApproximation, t.row, t.whole};
  if (!bf16) return t;
  t = bf16_rounded(t);
  t.abs += kBf16Ulp;
  return t;
}

// Three optimiser steps, about ten operations on each element per step.
inline constexpr Tolerance kOptimizerSteps = fp32_sums(32);

// The causal softmax of rows of T, forward p and backward ds (test_cuda_transformer.cpp,
// test_cuda_bf16.cpp; test_comparison.cpp runs the CPU's own outputs through them): sums over the
// row; p without a floor; in bf16, p rounded, and ds computed from that p and rounded again.
struct SoftmaxTolerance {
  Tolerance p, ds;
};
constexpr SoftmaxTolerance softmax_tolerance(int T, bool bf16) {
  const Tolerance sums = fp32_sums(T + 4, static_cast<std::size_t>(T));
  if (!bf16) return {without_floor(sums), sums};
  return {without_floor(bf16_rounded(sums)), bf16_rounded(bf16_rounded(sums))};
}


// cuDNN's bf16 attention against the CPU's tiled one (test_cudnn_attention.cpp; test_comparison.cpp
// runs the CPU's own outputs through them). Both sides round bf16 operands the same way and sum
// in fp32, but round the probabilities at different points (cuDNN before normalising, the CPU
// after) and y, dq, dk, dv at the end: two bf16 ulps of the value and of the position's
// largest, with the fp32 sums over T on top; the log-sum-exp is fp32 throughout (the sums of T
// exponentials, each side's exp). dq at a sequence's first position is 0 (one key, probability
// 1: dP - D cancels), each side left with fp32 noise of its terms' size, not of its row's: fp32
// sums of the whole array's largest on top (Tolerance::whole); so at dk of a packed sequence of
// one position (dk_j = dS_jj q_j, and dS_jj = 0 as P_jj = 1). dk and dv of a kv head add the
// products of its G = H / Hkv query heads, which cuDNN's graph types bf16 before its sum
// (dK_fullhead, dV_fullhead in the frontend's sdpa_backward): a bf16 ulp more per query head,
// G + 1 in all (2 without grouping).
struct AttentionTolerance {
  Tolerance y, lse, dq, kv;
};
inline AttentionTolerance attention_tolerance(const AttentionShape& s) {
  const std::size_t c = std::size_t(s.heads) * s.head_size;
  Tolerance rounded = fp32_sums(s.T + s.head_size + 4, c);
  rounded = {rounded.rel + 2 * kBf16Ulp, rounded.abs + 2 * kBf16Ulp, c};
  Tolerance dq = rounded;
  dq.whole = fp32_sums(s.T + s.head_size + 4).abs;
  const int group = s.heads / kv_heads_of(s);
  const Tolerance kv_sums = fp32_sums(group * s.T + s.head_size + 4);
  const Tolerance kv{kv_sums.rel + (group + 1) * kBf16Ulp, kv_sums.abs + (group + 1) * kBf16Ulp,
                     std::size_t(kv_heads_of(s)) * s.head_size, kv_sums.abs};
  return {rounded, fp32_sums(s.T + s.head_size + 4, std::size_t(s.T)), dq, kv};
}


// Every parameter tensor of `model` on its own, element by element (mismatches, which refuse
// NaN): `got` against `want`, both whole parameter (or gradient) buffers, each element within
// tol of itself and of its tensor's largest (tol.row is ignored: a tensor is a row). The names
// of the tensors that fail, each with its first mismatch.
struct TensorMismatch {
  std::string tensor;
  std::size_t count;
  Mismatch first;
};
inline std::vector<TensorMismatch> tensor_mismatches(const Model& model,
                                                     const std::vector<float>& got,
                                                     const std::vector<float>& want,
                                                     Tolerance tol) {
  if (got.size() != want.size()) return {{"(the whole buffer)", 1, {want.size(), kNaN, kNaN, 0}}};
  tol.row = 0;
  std::vector<TensorMismatch> bad;
  for (const ParamTensor& t : model.param_tensors()) {
    const auto part = [&](const std::vector<float>& all) {
      const auto from = all.begin() + static_cast<std::ptrdiff_t>(t.offset);
      return std::vector<float>(from, from + static_cast<std::ptrdiff_t>(t.numel()));
    };
    const std::vector<Mismatch> m = mismatches(part(got), part(want), tol);
    if (!m.empty()) bad.push_back({t.name, m.size(), m.front()});
  }
  return bad;
}

inline void check_each_tensor(const Model& model, const std::vector<float>& got,
                              const std::vector<float>& want, const Tolerance& tol) {
  for (const TensorMismatch& m : tensor_mismatches(model, got, want, tol))
    FAIL_CHECK(m.tensor << ": " << m.count << " elements differ; the first, " << m.first.index
                        << ": got " << m.first.got << ", want " << m.first.want << ", within "
                        << m.first.allowed);
}

// Runs the same op on the GPU and on a CPU device: op(device) returns the downloaded results
// to compare, output k within tols[k] of the CPU's, or all within tols[0] when it is the only
// one (Note [Comparing with the CPU]).
using Outputs = std::vector<std::vector<float>>;
inline void compare_each(Device& gpu, const std::function<Outputs(Device&)>& op,
                         const std::vector<Tolerance>& tols, NaNs nans = NaNs::refused) {
  auto cpu = make_cpu_device(0, 1);
  const Outputs want = op(*cpu), got = op(gpu);
  REQUIRE(got.size() == want.size());
  REQUIRE((tols.size() == 1 || tols.size() == got.size()));
  for (std::size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    check_close(got[k], want[k], tols[tols.size() == 1 ? 0 : k], nans);
  }
}

inline void compare(Device& gpu, const std::function<Outputs(Device&)>& op, const Tolerance& tol,
                    NaNs nans = NaNs::refused) {
  compare_each(gpu, op, {tol}, nans);
}

// An output buffer of n NaNs.
inline DeviceArray<float> poisoned(Device& dev, std::size_t n) {
  return on_device(dev, std::vector<float>(n, kNaN));
}

// An output buffer of n bf16 NaNs.
inline DeviceArray<std::uint16_t> poisoned_bf16(Device& dev, std::size_t n) {
  return on_device(dev, std::vector<std::uint16_t>(n, detail::kBf16QuietNan));
}

// Runs fn(rank, device, comm) on one thread per rank, each with its own device and attached
// communicator, as the trainer does; rethrows the first failure on the calling thread.
inline void on_ranks(Backend& backend, const std::vector<int>& ids,
              const std::function<void(int, Device&, Communicator&)>& fn) {
  auto comms = backend.create_communicators(ids);
  const int n = static_cast<int>(ids.size());
  std::mutex mutex;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto device = backend.create_device(ids[r], n, 0);
        comms[r]->attach(*device);
        fn(r, *device, *comms[r]);
      } catch (...) {
        {
          std::lock_guard lock(mutex);
          if (!error) error = std::current_exception();
        }
        comms[r]->abort();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace lockstep::test
