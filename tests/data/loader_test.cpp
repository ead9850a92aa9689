#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"

using lockstep::DistributedSampler;
using lockstep::ShardLoader;

namespace {

// Feature 0 is the sample's index and feature 1 its negation, so a batch shows which samples
// it holds; `get` can be made to fail or to be slow.
class IndexDataset final : public lockstep::Dataset {
 public:
  explicit IndexDataset(std::size_t n, std::size_t fail_at = SIZE_MAX,
                        std::chrono::milliseconds delay = {}, std::int32_t bad_label_at = -1)
      : n_(n), fail_at_(fail_at), delay_(delay), bad_label_at_(bad_label_at) {}
  std::size_t size() const noexcept override { return n_; }
  int features() const noexcept override { return 2; }
  int classes() const noexcept override { return 5; }
  void get(std::size_t i, float* x, std::int32_t* y) const override {
    if (i == fail_at_) throw std::runtime_error("cannot read sample " + std::to_string(i));
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    x[0] = static_cast<float>(i);
    x[1] = -static_cast<float>(i);
    *y = static_cast<std::int32_t>(i) == bad_label_at_ ? 5 : static_cast<std::int32_t>(i % 5);
  }

 private:
  std::size_t n_;
  std::size_t fail_at_;
  std::chrono::milliseconds delay_;
  std::int32_t bad_label_at_;
};

}  // namespace

TEST_CASE("batches_in") {
  CHECK(lockstep::batches_in(10, 3, false) == 4);
  CHECK(lockstep::batches_in(10, 3, true) == 3);
  CHECK(lockstep::batches_in(9, 3, false) == 3);
  CHECK(lockstep::batches_in(9, 3, true) == 3);
  CHECK(lockstep::batches_in(2, 3, true) == 0);
  CHECK(lockstep::batches_in(0, 3, false) == 0);
}

TEST_CASE("ShardLoader: yields the sampler's indices, epoch after epoch") {
  for (const bool drop_last : {false, true}) {
    CAPTURE(drop_last);
    auto data = std::make_shared<IndexDataset>(47);
    DistributedSampler sampler(47, 3, 1, true, 9, false);  // 16 samples per rank
    sampler.set_epoch(2);
    ShardLoader loader(data, sampler, 5, drop_last, 2);
    const std::size_t per_epoch = drop_last ? 3 : 4;
    CHECK(loader.batches_per_epoch() == per_epoch);

    for (std::uint64_t epoch = 2; epoch < 5; ++epoch) {
      sampler.set_epoch(epoch);
      const auto expected = sampler.indices();
      std::size_t k = 0;
      for (std::size_t b = 0; b < per_epoch; ++b) {
        const lockstep::Batch batch = loader.next();
        CHECK(batch.epoch == epoch);
        CHECK(batch.index_in_epoch == b);
        const int size = b == 3 ? 1 : 5;
        REQUIRE(batch.size == size);
        REQUIRE(batch.x.size() == 2 * static_cast<std::size_t>(size));
        REQUIRE(batch.y.size() == static_cast<std::size_t>(size));
        for (int i = 0; i < size; ++i, ++k) {
          CHECK(batch.x[2 * i] == static_cast<float>(expected[k]));
          CHECK(batch.x[2 * i + 1] == -static_cast<float>(expected[k]));
          CHECK(batch.y[i] == static_cast<std::int32_t>(expected[k] % 5));
        }
      }
    }
  }
}

TEST_CASE("ShardLoader: skip_batches resumes mid-epoch where a fresh loader would be") {
  auto data = std::make_shared<IndexDataset>(47);
  DistributedSampler sampler(47, 3, 2, true, 4, false);  // 16 samples per rank, 4 batches of 5
  sampler.set_epoch(6);
  ShardLoader fresh(data, sampler, 5, false, 2);
  std::vector<lockstep::Batch> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(fresh.next());

  for (const std::size_t skip : {0, 1, 3, 4}) {
    CAPTURE(skip);
    ShardLoader resumed(data, sampler, 5, false, 2, skip);
    for (std::size_t i = skip; i < expected.size(); ++i) {
      const lockstep::Batch b = resumed.next();
      CHECK(b.epoch == expected[i].epoch);
      CHECK(b.index_in_epoch == expected[i].index_in_epoch);
      CHECK(b.x == expected[i].x);
      CHECK(b.y == expected[i].y);
    }
  }
  CHECK(expected[4].epoch == 7);  // skipping a whole epoch starts the next one
  CHECK_THROWS_AS(ShardLoader(data, sampler, 5, false, 2, 5), std::invalid_argument);
}

TEST_CASE("ShardLoader: prefetch 1 through many batches") {
  auto data = std::make_shared<IndexDataset>(1000);
  ShardLoader loader(data, DistributedSampler(1000, 1, 0, true, 1, false), 1, false, 1);
  std::size_t sum = 0;
  for (int i = 0; i < 3000; ++i) sum += static_cast<std::size_t>(loader.next().x[0]);
  CHECK(sum == 3 * (999 * 1000 / 2));  // three full epochs, each sample once per epoch
}

TEST_CASE("ShardLoader: prefetch 0 assembles on the caller's thread the batches a thread would") {
  auto data = std::make_shared<IndexDataset>(47);
  DistributedSampler sampler(47, 3, 1, true, 9, false);  // 16 samples per rank, 4 batches of 5
  sampler.set_epoch(2);
  for (const std::size_t skip : {0, 2, 4}) {  // 4: the first epoch skipped whole
    CAPTURE(skip);
    ShardLoader threaded(data, sampler, 5, false, 2, skip);
    ShardLoader in_line(data, sampler, 5, false, 0, skip);
    for (int i = 0; i < 13; ++i) {  // into the fourth epoch
      const lockstep::Batch a = threaded.next(), b = in_line.next();
      CHECK(b.epoch == a.epoch);
      CHECK(b.index_in_epoch == a.index_in_epoch);
      CHECK(b.x == a.x);
      CHECK(b.y == a.y);
    }
  }
  // A loading error is thrown by the call that meets it, and again by every later call.
  auto bad = std::make_shared<IndexDataset>(20, 5);
  ShardLoader failing(bad, DistributedSampler(20, 1, 0, false, 0, false), 2, false, 0);
  CHECK(failing.next().x[0] == 0.0f);
  CHECK(failing.next().x[0] == 2.0f);
  CHECK_THROWS_WITH_AS(failing.next(), "cannot read sample 5", std::runtime_error);
  CHECK_THROWS_WITH_AS(failing.next(), "cannot read sample 5", std::runtime_error);
  ShardLoader stopped(data, sampler, 5, false, 0);
  stopped.stop();
  CHECK_THROWS_WITH_AS(stopped.next(), "loader stopped", std::runtime_error);
}

TEST_CASE("ShardLoader: a loading error reaches next(), after the batches before it") {
  auto data = std::make_shared<IndexDataset>(20, 5);
  ShardLoader loader(data, DistributedSampler(20, 1, 0, false, 0, false), 2, false, 4);
  CHECK(loader.next().x[0] == 0.0f);
  CHECK(loader.next().x[0] == 2.0f);
  CHECK_THROWS_WITH_AS(loader.next(), "cannot read sample 5", std::runtime_error);
  CHECK_THROWS_WITH_AS(loader.next(), "cannot read sample 5", std::runtime_error);

  auto bad = std::make_shared<IndexDataset>(20, SIZE_MAX, std::chrono::milliseconds(0), 3);
  ShardLoader bad_loader(bad, DistributedSampler(20, 1, 0, false, 0, false), 4, false, 1);
  CHECK_THROWS_AS(bad_loader.next(), lockstep::InputError);
}

TEST_CASE("ShardLoader: too small a shard is an input error") {
  auto data = std::make_shared<IndexDataset>(10);
  CHECK_THROWS_WITH_AS(
      ShardLoader(data, DistributedSampler(10, 2, 0, true, 0, false), 8, true, 2),
      "dataset too small: worker shard has no full batch (5 samples of 10 per worker over 10 "
      "sampled positions, batch_size 8, drop_last true)",
      lockstep::InputError);
  CHECK_THROWS_AS(ShardLoader(data, DistributedSampler(10, 16, 3, true, 0, true), 1, false, 2),
                  lockstep::InputError);
  CHECK_THROWS_AS(ShardLoader(data, DistributedSampler(10, 1, 0, true, 0, false), 0, false, 2),
                  std::invalid_argument);
  CHECK_THROWS_AS(ShardLoader(data, DistributedSampler(10, 1, 0, true, 0, false), 2, false, -1),
                  std::invalid_argument);  // prefetch 0 is valid: no loader thread
}

TEST_CASE("ShardLoader: stop and destruction never hang") {
  auto data = std::make_shared<IndexDataset>(100);
  {
    ShardLoader loader(data, DistributedSampler(100, 1, 0, true, 0, false), 1, false, 1);
    loader.next();
    // Let the producer fill the queue and block on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    ShardLoader loader(data, DistributedSampler(100, 1, 0, true, 0, false), 1, false, 1);
    loader.stop();
    loader.stop();
    CHECK_THROWS_WITH_AS(loader.next(), "loader stopped", std::runtime_error);
  }

  // stop() from another thread wakes a next() waiting on a slow dataset.
  auto slow = std::make_shared<IndexDataset>(100, SIZE_MAX, std::chrono::milliseconds(50));
  ShardLoader loader(slow, DistributedSampler(100, 1, 0, true, 0, false), 10, false, 1);
  std::atomic<bool> stopped_error{false};
  std::thread consumer([&] {
    try {
      while (true) loader.next();
    } catch (const std::runtime_error& e) {
      stopped_error = std::string(e.what()) == "loader stopped";
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  loader.stop();
  consumer.join();
  CHECK(stopped_error);
}
