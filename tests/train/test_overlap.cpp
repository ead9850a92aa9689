// Overlap as a GPU sees it: a bucket's all-reduce is only enqueued when backward fills it, and
// finishes later, on its own; nothing the worker does next may wait for it before the
// optimiser. A slow fake communicator plays the comm stream on the CPU.
#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "../comm/group_of_one.hpp"
#include "comm/comm_thread.hpp"
#include "lockstep/lockstep.hpp"
#include "train/reducer.hpp"
#include "train/trace.hpp"

using namespace lockstep;

namespace {

constexpr double kDelay_s = 0.2;  // each collective's time on the fake wire

// One rank (every collective is the identity) whose async collectives run one after another on
// a thread, each taking kDelay_s: as a GPU's comm stream runs the collectives enqueued on it.
// Logs, on the steady clock, when each was started (enqueued) and when it finished.
class SlowCommunicator final : public test::GroupOfOne {
 public:
  std::vector<double> started_s, finished_s;  // per collective, in start order

 protected:
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    const std::size_t k = started_s.size();
    {
      std::lock_guard lock(mutex_);
      started_s.push_back(detail::steady_now_s());
      finished_s.push_back(0.0);
    }
    return thread_.submit([this, k, collective = std::move(collective)] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kDelay_s));
      collective();
      std::lock_guard lock(mutex_);
      finished_s[k] = detail::steady_now_s();
    });
  }

 private:
  std::mutex mutex_;
  detail::CommThread thread_;  // last: stops before the logs go
};

}  // namespace

TEST_CASE("backward enqueues every bucket without waiting for the previous one to finish") {
  const Model model = Model::mlp({.inputs = 32, .hidden = {64, 64, 64}, .classes = 8});
  auto device = make_cpu_device(0, 1);
  Replica replica(*device, model, 4);
  replica.load_parameters(model.initial_parameters(1));
  SlowCommunicator comm;
  // One bucket per Linear layer (the smallest holds 8 x 64 + 8 floats, 2 KiB).
  detail::Reducer reducer(model, comm, *device, replica.grads(),
                          detail::plan_buckets(model, 0.001), /*overlap=*/true, /*zero=*/false,
                          detail::CommMode::async, ReduceDtype::fp32, nullptr);
  const std::size_t buckets = reducer.buckets().size();
  REQUIRE(buckets == 4);

  DeviceArray<float> x(*device, 4 * 32), dlogits(*device, 4 * 8);
  x.upload(std::vector<float>(4 * 32, 0.5f));
  dlogits.upload(std::vector<float>(4 * 8, 0.25f));
  replica.zero_grads();
  reducer.reset();
  (void)replica.forward(x.data(), 4);
  std::vector<double> layer_done_s;
  replica.backward(x.data(), dlogits.data(), 4, [&](std::size_t layer) {
    layer_done_s.push_back(detail::steady_now_s());
    reducer.layer_ready(layer);
  });
  reducer.launch_remaining();
  const double backward_end_s = detail::steady_now_s();
  REQUIRE(comm.started_s.size() == buckets);

  // Backward ran to its end while the first bucket was still on the wire, and each bucket was
  // enqueued before the one before it finished: nothing in backward waited for a collective.
  const double first_done_s = comm.started_s[0] + kDelay_s;
  CHECK(backward_end_s < first_done_s);
  CHECK(layer_done_s.back() < first_done_s);
  for (std::size_t k = 1; k < buckets; ++k) CHECK(comm.started_s[k] < comm.started_s[k - 1] + kDelay_s);

  // Only the optimiser's waits block, and they find the collectives in flight: the time they
  // blocked is the wire's time left, counted as exposed, and each ran kDelay_s.
  for (std::size_t k = 0; k < buckets; ++k) reducer.wait(k);
  reducer.collect_timings();
  for (std::size_t k = 0; k < buckets; ++k) CHECK(comm.finished_s[k] > 0.0);
  CHECK(reducer.comm_seconds() >= buckets * kDelay_s * 0.99);
  CHECK(reducer.exposed_seconds() > (buckets - 1) * kDelay_s);
  CHECK(reducer.exposed_seconds() <= reducer.comm_seconds() + 0.05);
}
