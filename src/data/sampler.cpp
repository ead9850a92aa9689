// DistributedSampler: PyTorch's torch.utils.data.DistributedSampler, on the portable generator.
#include <numeric>
#include <stdexcept>
#include <string>

#include "data/shuffle.hpp"
#include "lockstep/dataset.hpp"

namespace lockstep {

DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, std::uint64_t seed, bool drop_last)
    : size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  if (num_replicas < 1) {
    throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1, got " +
                                std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: rank must be in [0, " +
                                std::to_string(num_replicas) + "), got " + std::to_string(rank));
  }
}

void DistributedSampler::start_at(std::uint64_t epoch, std::size_t position) {
  if (position > size_)
    throw std::invalid_argument("DistributedSampler: start position " + std::to_string(position) +
                                " is past the " + std::to_string(size_) + " samples of an epoch");
  start_epoch_ = epoch;
  start_ = position;
}

std::size_t DistributedSampler::samples_from(std::size_t start) const noexcept {
  // PyTorch: drop_last gives ceil((size - N) / N) when size % N != 0, which is floor(size / N)
  // (0 when size < N); otherwise ceil(size / N), the tail padded by wrap-around. From a start
  // position, the same of the size - start positions left.
  const auto n = static_cast<std::size_t>(num_replicas_);
  const std::size_t left = size_ - start;
  return drop_last_ ? left / n : (left + n - 1) / n;
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> order;
  if (shuffle_) {
    std::uint64_t state = seed_ + epoch_;
    order = detail::permutation(size_, state);
  } else {
    order.resize(size_);
    std::iota(order.begin(), order.end(), std::size_t{0});
  }

  // Position p of the padded (or truncated) global order is order[p % size]: PyTorch repeats
  // the permutation from its start as often as the padding needs; with drop_last p < size.
  const auto n = static_cast<std::size_t>(num_replicas_);
  const std::size_t first = start() + static_cast<std::size_t>(rank_);
  std::vector<std::size_t> mine(num_samples());
  for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = order[(first + k * n) % size_];
  return mine;
}

}  // namespace lockstep
