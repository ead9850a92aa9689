// Overlap as a GPU sees it: a bucket's all-reduce is only enqueued when backward fills it, and
// finishes later, on its own; nothing the worker does next may wait for it before the
// optimiser. A fake communicator plays the comm stream on the CPU. Its collective k is held at
// a gate that only the optimiser's wait for bucket k opens, so the test asserts on the order of
// events, which a busy machine cannot change, not on how long things took (issue 30).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../comm/group_of_one.hpp"
#include "comm/comm_thread.hpp"
#include "lockstep/lockstep.hpp"
#include "train/reducer.hpp"

using namespace lockstep;

namespace {

constexpr double kDelay_s = 0.1;  // each collective's time on the fake wire, once let through
// The longest a gate stays shut: a backward that waited for a collective would wait forever;
// the gate opens by itself then, the collective finishes before backward ends, and the order of
// events says so.
constexpr auto kGateLimit = std::chrono::seconds(30);

// What happened, in order, from every thread.
class EventLog {
 public:
  void add(const std::string& event) {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
  }
  std::vector<std::string> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  // Where `event` is in the log; the log's length when it is not there.
  std::size_t position(const std::string& event) const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::find(events_.begin(), events_.end(), event) -
                                    events_.begin());
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> events_;
};

// One rank (every collective the identity) whose async collectives run one after another on a
// thread, as a GPU's comm stream runs what is enqueued on it. Collective k waits at gate k,
// which its CommWork's wait() opens, then takes kDelay_s. Logs "start k" when enqueued,
// "wait k" when waited for, "finish k" when done, and "gate k forced" when its gate gave up.
class GatedCommunicator final : public test::GroupOfOne {
 public:
  explicit GatedCommunicator(EventLog& log) : log_(log) {}
  ~GatedCommunicator() override { open_all(); }

  std::size_t started() const {
    std::lock_guard lock(mutex_);
    return open_.size();
  }

 protected:
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    std::size_t k;
    {
      std::lock_guard lock(mutex_);
      k = open_.size();
      open_.push_back(false);
    }
    log_.add(fmt::format("start {}", k));
    auto work = thread_.submit([this, k, collective = std::move(collective)] {
      pass_gate(k);
      std::this_thread::sleep_for(std::chrono::duration<double>(kDelay_s));
      collective();
      log_.add(fmt::format("finish {}", k));
    });
    return std::make_unique<GatedWork>(*this, k, std::move(work));
  }

 private:
  struct GatedWork final : CommWork {
    GatedWork(GatedCommunicator& c, std::size_t i, std::unique_ptr<CommWork> w)
        : comm(c), k(i), work(std::move(w)) {}
    void wait() override {
      comm.log_.add(fmt::format("wait {}", k));
      comm.open(k);
      work->wait();
    }
    std::optional<CommTiming> timing() override { return work->timing(); }
    GatedCommunicator& comm;
    std::size_t k;
    std::unique_ptr<CommWork> work;
  };

  void open(std::size_t k) {
    {
      std::lock_guard lock(mutex_);
      open_[k] = true;
    }
    cv_.notify_all();
  }
  void open_all() {
    {
      std::lock_guard lock(mutex_);
      std::fill(open_.begin(), open_.end(), true);
    }
    cv_.notify_all();
  }
  void pass_gate(std::size_t k) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, kGateLimit, [&] { return bool(open_[k]); }))
      log_.add(fmt::format("gate {} forced", k));
  }

  EventLog& log_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<bool> open_;     // per collective, in start order
  detail::CommThread thread_;  // last: stops before the gates go
};

}  // namespace

TEST_CASE("backward enqueues every bucket without waiting for the previous one to finish") {
  const Model model = Model::mlp({.inputs = 32, .hidden = {64, 64, 64}, .classes = 8});
  auto device = make_cpu_device(0, 1);
  Replica replica(*device, model, 4);
  replica.load_parameters(model.initial_parameters(1));
  EventLog log;
  GatedCommunicator comm(log);
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
  replica.backward(x.data(), dlogits.data(), 4, [&](std::size_t layer) {
    log.add(fmt::format("layer {} done", layer));
    reducer.layer_ready(layer);
  });
  reducer.launch_remaining();
  log.add("backward end");
  REQUIRE(comm.started() == buckets);

  // Backward ran to its end with every bucket enqueued, and waited for none: no collective was
  // waited for, finished or let through by force before it ended.
  const std::vector<std::string> during = log.events();
  CAPTURE(fmt::format("{}", fmt::join(during, ", ")));
  const std::size_t end = log.position("backward end");
  for (std::size_t k = 0; k < buckets; ++k) CHECK(log.position(fmt::format("start {}", k)) < end);
  for (const std::string& event : during)
    CHECK_MESSAGE((event.starts_with("start ") || event.starts_with("layer ") ||
                   event == "backward end"),
                  event);

  // Only the optimiser's waits block, and they find the collectives in flight: wait k lets
  // collective k through, which then takes kDelay_s, and finishes before wait k returns.
  double blocked_s = 0.0;
  for (std::size_t k = 0; k < buckets; ++k) blocked_s += reducer.wait(k);
  reducer.collect_timings();
  const std::vector<std::string> after = log.events();
  CAPTURE(fmt::format("{}", fmt::join(after, ", ")));
  for (std::size_t k = 0; k < buckets; ++k) {
    const std::size_t finish = log.position(fmt::format("finish {}", k));
    CHECK(log.position(fmt::format("wait {}", k)) < finish);
    if (k + 1 < buckets) CHECK(finish < log.position(fmt::format("wait {}", k + 1)));
  }
  CHECK(std::none_of(after.begin(), after.end(),
                     [](const std::string& e) { return e.ends_with(" forced"); }));
  // Times, lower bounds a busy machine only makes easier to meet: each collective ran at least
  // kDelay_s after its gate opened (comm). The time the waits blocked is counted as exposed:
  // never more than the reducer's own clock around the waits (the collectives' waits sit inside
  // them), and at least half of each kDelay_s: a wait loses only the moment between opening the
  // gate and blocking, microseconds idle, a few scheduler slices (ms) under load.
  CHECK(reducer.comm_seconds() >= buckets * kDelay_s * 0.99);
  CHECK(reducer.exposed_seconds() <= blocked_s);
  CHECK(reducer.exposed_seconds() >= buckets * kDelay_s / 2);
}
