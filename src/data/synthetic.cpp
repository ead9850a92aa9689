// make_synthetic(): a Gaussian mixture with one component per class.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "common/random.hpp"
#include "data/shuffle.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"

namespace lockstep {

namespace {

// Class centres ~ N(0, kCentreScale^2) per feature, samples ~ centre + N(0, kNoise^2). The
// classes overlap with few features and separate as features are added: with 10 classes the
// nearest-class-mean rule scores about 34% at 2 features, 58% at 4, 81% at 8, 99.9% at 32.
constexpr double kCentreScale = 1.0;
constexpr double kNoise = 1.0;

// Below this many values a thread costs more than it saves.
constexpr std::size_t kValuesPerThread = std::size_t{1} << 20;

// Separates this generator's draws from the other users of the same seed (the split).
constexpr std::uint64_t kSyntheticStream = 0x73796e7468000000ull;  // "synth"

}  // namespace

InMemoryDataset make_synthetic(std::size_t samples, int features, int classes, std::uint64_t seed) {
  if (features < 1) {
    throw InputError(fmt::format("synthetic data: expected at least 1 feature, got {}", features));
  }
  if (classes < 2) {
    throw InputError(fmt::format("synthetic data: expected at least 2 classes, got {}", classes));
  }
  const auto f = static_cast<std::size_t>(features);
  const auto k = static_cast<std::size_t>(classes);
  if (samples > std::numeric_limits<std::size_t>::max() / sizeof(float) / f) {
    throw InputError(fmt::format("synthetic data: {} samples x {} features do not fit in memory",
                                 samples, features));
  }

  std::uint64_t state = detail::mix64(seed ^ kSyntheticStream);
  std::vector<float> centres(k * f);
  for (float& c : centres) c = static_cast<float>(kCentreScale * detail::normal(state));

  // Round-robin labels give every class the same count (to within one); the shuffle spreads
  // them so that any prefix or shard is balanced too, on average.
  std::vector<std::int32_t> y(samples);
  for (std::size_t i = 0; i < samples; ++i) y[i] = static_cast<std::int32_t>(i % k);
  detail::shuffle(std::span<std::int32_t>(y), state);

  // Each row draws its noise from its own stream, so rows are filled in parallel and the data
  // does not depend on the thread count.
  const std::uint64_t row_streams = detail::splitmix64(state);
  std::vector<float> x(samples * f);
  auto fill_rows = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      std::uint64_t row_state = detail::mix64(row_streams + i);
      const float* centre = centres.data() + static_cast<std::size_t>(y[i]) * f;
      float* row = x.data() + i * f;
      for (std::size_t j = 0; j < f; ++j) {
        row[j] = centre[j] + static_cast<float>(kNoise * detail::normal(row_state));
      }
    }
  };
  const std::size_t threads = std::clamp<std::size_t>(
      samples * f / kValuesPerThread, 1, std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t chunk = (samples + threads - 1) / threads;
  {
    std::vector<std::jthread> helpers;
    for (std::size_t t = 1; t < threads; ++t) {
      helpers.emplace_back(fill_rows, t * chunk, std::min(samples, (t + 1) * chunk));
    }
    fill_rows(0, std::min(samples, chunk));
  }
  return InMemoryDataset(std::move(x), std::move(y), features, classes);
}

}  // namespace lockstep
