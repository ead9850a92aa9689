// Whole-buffer reductions: the sum of squares (whole, or per grain and the step's scalars from
// it) and the replica hash (CUDA: src/cuda/ops/reduce.cu).
#include "cpu/cpu_device.hpp"

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "common/elementwise_math.hpp"

namespace lockstep::cpu {

double CpuDevice::sum_squares(const float* x, std::size_t n) {
  count_host_sync();
  return reduce_blocks<double>(
      n, kGrain,
      [&](std::size_t i0, std::size_t i1) {
        double s = 0.0;
        for (std::size_t i = i0; i < i1; ++i) s += double(x[i]) * double(x[i]);
        return s;
      },
      [](double acc, double s) { return acc + s; });
}

namespace {

// Note [Eight lanes for the gradient norm]
//   The step's norm reads every gradient once more (Note [One read per step] in
//   src/train/step_record.hpp). One running double sum per grain made that pass a chain of
//   dependent additions, four cycles each: 8% of a 2-worker step of the large MLP of
//   bench/compare_ddp.py. Element i of a grain goes to lane i % 8 instead, and the lanes are
//   added pairwise at the end: eight independent chains that vectorise, the same order for a
//   grain wherever the call starts and whatever the device count, so the norm stays the same on
//   every replica. (The CUDA kernel sums in another order; its test allows for it.)
double sum_squares_in_lanes(const float* x, std::size_t n) {
  constexpr std::size_t kLanes = 8;
  double lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) lane[j] += double(x[i + j]) * double(x[i + j]);
  for (std::size_t j = 0; i + j < n; ++j) lane[j] += double(x[i + j]) * double(x[i + j]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

void CpuDevice::sum_squares_grains(const float* x, std::size_t n, std::size_t grain,
                                   double* out) {
  if (grain == 0) throw std::invalid_argument("sum_squares_grains: grain 0");
  for_blocks(blocks_of(n, grain), [&](std::size_t g) {
    const std::size_t begin = g * grain;
    out[g] = sum_squares_in_lanes(x + begin, std::min(n, begin + grain) - begin);
  });
}

void CpuDevice::step_control(const double* grain_sums, std::size_t grains, double clip_norm,
                             StepControl* control) {
  double norm_sq = 0.0;
  for (std::size_t g = 0; g < grains; ++g) norm_sq += grain_sums[g];
  const detail::StepScalars s = detail::step_scalars(norm_sq, clip_norm);
  *control = {.grad_norm = s.grad_norm, .clip_scale = s.clip_scale, .skip = s.skip};
}

// n + sum over i of hash_term(bits(x[i]), i), mod 2^64: exactly associative.
std::uint64_t CpuDevice::hash(const float* x, std::size_t n) {
  count_host_sync();
  return n + reduce_blocks<std::uint64_t>(
                 n, kGrain,
                 [&](std::size_t i0, std::size_t i1) {
                   std::uint64_t h = 0;
                   for (std::size_t i = i0; i < i1; ++i)
                     h += detail::hash_term(std::bit_cast<std::uint32_t>(x[i]), i);
                   return h;
                 },
                 [](std::uint64_t acc, std::uint64_t h) { return acc + h; });
}

}  // namespace lockstep::cpu
