// The slot that holds each NCCL communicator (Note [Abort without the lock] in
// src/cuda/abortable_slot.hpp): one thread inside at a time, and an abort that never waits for
// it. Plain C++, so it runs without a GPU (and under TSan, with the comm tests).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "cuda/abortable_slot.hpp"

using lockstep::cuda::AbortableSlot;
using namespace std::chrono_literals;

namespace {

// Counts the aborts of the resource and remembers the thread that made the last one.
struct AbortLog {
  std::atomic<int> aborts{0};
  std::thread::id by;
  std::function<void()> abort_fn() {
    return [this] {
      by = std::this_thread::get_id();
      aborts.fetch_add(1);
    };
  }
};

}  // namespace

TEST_CASE("abortable slot: with nobody inside, abort ends the resource at once, once") {
  AbortLog log;
  AbortableSlot slot(log.abort_fn());
  int runs = 0;
  CHECK(slot.use([&] { ++runs; }));
  slot.abort();
  CHECK(log.aborts == 1);
  CHECK(log.by == std::this_thread::get_id());
  CHECK(slot.ended());
  CHECK_FALSE(slot.use([&] { ++runs; }));
  slot.abort();
  bool destroyed = false;
  slot.release([&] { destroyed = true; });
  CHECK(runs == 1);
  CHECK(log.aborts == 1);
  CHECK_FALSE(destroyed);  // an aborted resource is not destroyed as well
}

// The case an NCCL enqueue blocked on a dead peer made: a mutex held across the call kept the
// abort waiting for ever, and the bounded stop never fired.
TEST_CASE("abortable slot: abort returns while a thread is blocked inside, which then aborts") {
  AbortLog log;
  AbortableSlot slot(log.abort_fn());
  std::atomic<bool> inside{false}, gate{false};
  std::thread::id holder;
  std::future<bool> user = std::async(std::launch::async, [&] {
    holder = std::this_thread::get_id();
    return slot.use([&] {
      inside = true;
      while (!gate) std::this_thread::sleep_for(1ms);
    });
  });
  while (!inside) std::this_thread::sleep_for(1ms);
  std::future<void> aborter = std::async(std::launch::async, [&] { slot.abort(); });
  const bool returned = aborter.wait_for(2s) == std::future_status::ready;
  const int aborts_while_inside = log.aborts;
  gate = true;  // lets a wrong slot's abort finish too, so a failure cannot hang the suite
  CHECK_MESSAGE(returned, "abort() waited for the thread inside the slot");
  CHECK(aborts_while_inside == 0);  // never under the holder's call
  CHECK(slot.abort_requested());
  CHECK(user.get());
  aborter.get();
  CHECK(log.aborts == 1);
  CHECK(log.by == holder);  // the holder ended it on its way out
  CHECK_FALSE(slot.use([] {}));
}

TEST_CASE("abortable slot: release waits for the thread inside and ends the resource once") {
  AbortLog log;
  AbortableSlot slot(log.abort_fn());
  std::atomic<bool> inside{false}, gate{false}, left{false};
  std::future<void> user = std::async(std::launch::async, [&] {
    slot.use([&] {
      inside = true;
      while (!gate) std::this_thread::sleep_for(1ms);
      left = true;
    });
  });
  while (!inside) std::this_thread::sleep_for(1ms);
  std::atomic<int> destroyed{0};
  std::future<void> releaser =
      std::async(std::launch::async, [&] { slot.release([&] { destroyed += left ? 1 : 100; }); });
  CHECK(releaser.wait_for(50ms) == std::future_status::timeout);
  gate = true;
  releaser.get();
  user.get();
  CHECK(destroyed == 1);  // after the user left, exactly once
  slot.abort();
  CHECK(log.aborts == 0);
}

TEST_CASE("abortable slot: one thread inside at a time, and none after an abort from outside") {
  AbortLog log;
  AbortableSlot slot(log.abort_fn());
  std::atomic<int> inside{0}, most{0}, after_abort{0};
  std::atomic<bool> aborted{false};
  std::vector<std::thread> users;
  for (int t = 0; t < 4; ++t)
    users.emplace_back([&] {
      for (int i = 0; i < 50'000'000; ++i) {  // until refused; the bound only ends a failure
        const bool entered = slot.use([&] {
          const int now = inside.fetch_add(1) + 1;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          if (aborted) after_abort.fetch_add(1);
          inside.fetch_sub(1);
        });
        if (!entered) return;
      }
    });
  std::this_thread::sleep_for(5ms);
  slot.abort();
  aborted = true;  // from here a use() that enters is one that was inside already, or a bug
  for (std::thread& u : users) u.join();
  CHECK(most == 1);
  CHECK(log.aborts == 1);
  // Only a user already inside when the flag was set can see it; it leaves and none enters.
  CHECK(after_abort <= 1);
  CHECK_FALSE(slot.use([] {}));
}
