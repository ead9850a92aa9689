// ShardLoader: one worker's batches, assembled on a background thread into a bounded queue, or
// on the caller's thread when there is no read-ahead (prefetch 0).
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "common/start_thread.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"

namespace lockstep {

struct ShardLoader::State {
  State(std::shared_ptr<const Dataset> d, DistributedSampler smp, std::size_t batch, bool drop,
        std::size_t cap, std::size_t skip)
      : data(std::move(d)),
        sampler(smp),
        batch_size(batch),
        drop_last(drop),
        capacity(cap),
        skip_batches(skip) {}

  std::shared_ptr<const Dataset> data;
  DistributedSampler sampler;
  std::size_t batch_size;
  bool drop_last;
  std::size_t capacity;      // 0: no producer, next() assembles
  std::size_t skip_batches;  // of the first epoch only
  std::size_t per_epoch = 0;  // batches of a whole epoch

  // Where the next batch comes from; only the producer touches it, or next() when there is none.
  bool started = false;
  std::uint64_t epoch = 0;
  std::size_t index = 0;  // of the next batch in the epoch
  std::vector<std::size_t> order;

  std::mutex mutex;
  std::condition_variable ready;  // a batch, an error or stop: wakes next()
  std::condition_variable room;   // space in the queue or stop: wakes the producer
  std::deque<Batch> queue;
  std::exception_ptr error;
  bool stopped = false;
  std::thread producer;

  Batch assemble(std::span<const std::size_t> indices, std::uint64_t epoch,
                 std::size_t index_in_epoch) const;
  Batch advance();
  void produce();
};

Batch ShardLoader::State::assemble(std::span<const std::size_t> indices, std::uint64_t epoch,
                                   std::size_t index_in_epoch) const {
  const auto features = static_cast<std::size_t>(data->features());
  const auto targets = static_cast<std::size_t>(data->targets());
  Batch b;
  b.x.resize(indices.size() * features);
  b.y.resize(indices.size() * targets);
  if (data->packed()) b.positions.resize(indices.size() * features);
  b.size = static_cast<int>(indices.size());
  b.epoch = epoch;
  b.index_in_epoch = index_in_epoch;
  const bool masks = data->masks_targets();
  for (std::size_t k = 0; k < indices.size(); ++k) {
    std::int32_t* y = b.y.data() + k * targets;
    data->get(indices[k], b.x.data() + k * features, y);
    if (!b.positions.empty()) data->get_positions(indices[k], b.positions.data() + k * features);
    // Dataset is open to user subclasses; a bad label is bad input (the loss would also catch
    // it on the device, but here the sample is known).
    for (std::size_t t = 0; t < targets; ++t) {
      if (masks && y[t] == kIgnoreLabel) continue;
      if (y[t] < 0 || y[t] >= data->classes())
        throw InputError(fmt::format("dataset: sample {}: label {} is outside [0, {})",
                                     indices[k], y[t], data->classes()));
      ++b.counted;
    }
  }
  return b;
}

// The next batch of the epoch, moving on to the next epoch at the end of one. When assemble()
// throws, nothing moves: the next call tries the same batch again.
Batch ShardLoader::State::advance() {
  // A whole epoch has >= 1 batch (checked by the constructor); the rest of one begun at a start
  // position (DistributedSampler::start_at) may have none.
  const auto batches = [&] {
    return batches_in(sampler.num_samples(), static_cast<int>(batch_size), drop_last);
  };
  if (!started || index >= batches()) {
    epoch = started ? epoch + 1 : sampler.epoch();
    index = started ? 0 : skip_batches;
    started = true;
    sampler.set_epoch(epoch);
    order = sampler.indices();
    if (index >= batches()) return advance();  // the first epoch was skipped whole
  }
  const std::size_t begin = index * batch_size;
  const std::size_t count = std::min(batch_size, order.size() - begin);
  Batch b = assemble(std::span(order).subspan(begin, count), epoch, index);
  b.epoch_start = sampler.start();
  b.last_in_epoch = ++index == batches();
  return b;
}

void ShardLoader::State::produce() {
  try {
    for (;;) {
      Batch b = advance();
      std::unique_lock lock(mutex);
      room.wait(lock, [&] { return stopped || queue.size() < capacity; });
      if (stopped) return;
      queue.push_back(std::move(b));
      ready.notify_one();
    }
  } catch (...) {
    const std::lock_guard lock(mutex);
    error = std::current_exception();
    ready.notify_all();
  }
}

ShardLoader::ShardLoader(std::shared_ptr<const Dataset> data, DistributedSampler sampler,
                         int batch_size, bool drop_last, int prefetch, std::size_t skip_batches) {
  if (!data) throw std::invalid_argument("ShardLoader: no dataset");
  if (batch_size < 1) {
    throw std::invalid_argument(
        fmt::format("ShardLoader: batch_size must be >= 1, got {}", batch_size));
  }
  if (prefetch < 0) {
    throw std::invalid_argument(
        fmt::format("ShardLoader: prefetch must be >= 0, got {}", prefetch));
  }
  // Batches of a whole epoch (the sampler's first may begin at a start position).
  const std::size_t per_epoch = batches_in(sampler.whole_epoch_samples(), batch_size, drop_last);
  if (per_epoch == 0) {
    throw InputError(fmt::format(
        "dataset too small: worker shard has no full batch ({} samples of {} per worker over "
        "{} sampled positions, batch_size {}, drop_last {})",
        sampler.whole_epoch_samples(), data->size(),
        sampler.whole_epoch_samples() * static_cast<std::size_t>(sampler.num_replicas()),
        batch_size, drop_last));
  }
  const std::size_t first_epoch = batches_in(sampler.num_samples(), batch_size, drop_last);
  if (skip_batches > first_epoch) {
    throw std::invalid_argument(fmt::format(
        "ShardLoader: skip_batches {} exceeds the {} batches of the first epoch", skip_batches,
        first_epoch));
  }
  state_ = std::make_unique<State>(std::move(data), sampler, static_cast<std::size_t>(batch_size),
                                   drop_last, static_cast<std::size_t>(prefetch), skip_batches);
  state_->per_epoch = per_epoch;
  if (prefetch > 0)
    state_->producer =
        detail::start_thread("the loader thread", [s = state_.get()] { s->produce(); });
}

ShardLoader::~ShardLoader() { stop(); }

std::size_t ShardLoader::batches_per_epoch() const noexcept { return state_->per_epoch; }

Batch ShardLoader::next() {
  State& s = *state_;
  if (s.capacity == 0) {
    {
      const std::lock_guard lock(s.mutex);  // stop() may come from another thread
      if (s.stopped) throw std::runtime_error("loader stopped");
    }
    return s.advance();
  }
  std::unique_lock lock(s.mutex);
  s.ready.wait(lock, [&] { return s.stopped || !s.queue.empty() || s.error; });
  if (s.stopped) throw std::runtime_error("loader stopped");
  // Batches assembled before a failure are still delivered; then the error, on every call.
  if (s.queue.empty()) std::rethrow_exception(s.error);
  Batch b = std::move(s.queue.front());
  s.queue.pop_front();
  s.room.notify_one();
  return b;
}

void ShardLoader::stop() noexcept {
  State& s = *state_;
  {
    const std::lock_guard lock(s.mutex);
    s.stopped = true;
  }
  s.ready.notify_all();
  s.room.notify_all();
  if (s.producer.joinable()) s.producer.join();
}

std::size_t batches_in(std::size_t samples, int batch_size, bool drop_last) noexcept {
  if (batch_size < 1) return 0;
  const auto b = static_cast<std::size_t>(batch_size);
  return drop_last ? samples / b : (samples + b - 1) / b;
}

}  // namespace lockstep
