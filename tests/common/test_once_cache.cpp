// OnceCache (src/common/once_cache.hpp), which holds cuDNN's attention plans (Note [cuDNN plan
// cache] in src/cuda/cudnn_attention.cpp): one build per key however many threads ask, builds of
// different keys at the same time, a failed build kept and rethrown.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/once_cache.hpp"

using lockstep::detail::OnceCache;

TEST_CASE("once cache: four threads asking for one key build it once and share it") {
  OnceCache<int, std::string> cache;
  std::atomic<int> builds{0};
  std::promise<void> release;
  const std::shared_future<void> released = release.get_future().share();
  std::vector<std::future<std::shared_ptr<const std::string>>> asks;
  for (int t = 0; t < 4; ++t)
    asks.push_back(std::async(std::launch::async, [&] {
      return cache.get(7, [&] {
        ++builds;
        released.wait();  // the others ask while this build runs
        return std::string("plan 7");
      });
    }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release.set_value();
  std::vector<std::shared_ptr<const std::string>> got;
  for (auto& a : asks) got.push_back(a.get());
  CHECK(builds == 1);
  for (const auto& p : got) {
    REQUIRE(p);
    CHECK(*p == "plan 7");
    CHECK(p == got.front());  // the same value, shared
  }
}

TEST_CASE("once cache: different keys build at the same time, not one after another") {
  // Key 1's build waits until key 2's has started: built under one lock, it would wait forever
  // (here: time out, and fail).
  OnceCache<int, int> cache;
  std::promise<void> two_started;
  std::shared_future<void> started = two_started.get_future().share();
  auto one = std::async(std::launch::async, [&] {
    return cache.get(1, [&] {
      return started.wait_for(std::chrono::seconds(10)) == std::future_status::ready ? 1 : -1;
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto two = std::async(std::launch::async, [&] {
    return cache.get(2, [&] {
      two_started.set_value();
      return 2;
    });
  });
  CHECK(*one.get() == 1);
  CHECK(*two.get() == 2);
}

TEST_CASE("once cache: a failed build is kept and rethrown, never built again") {
  OnceCache<int, int> cache;
  int builds = 0;
  const auto refuse = [&]() -> int {
    ++builds;
    throw std::runtime_error("cudnn frontend: build_plans of sdpa_backward failed");
  };
  for (int i = 0; i < 3; ++i)
    CHECK_THROWS_WITH_AS(cache.get(5, refuse), doctest::Contains("build_plans"),
                         std::runtime_error);
  CHECK(builds == 1);
  CHECK(*cache.get(6, [] { return 6; }) == 6);  // other keys still build
}
