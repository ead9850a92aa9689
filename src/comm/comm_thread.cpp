#include "comm/comm_thread.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>

#include "comm/spin_wait.hpp"
#include "common/start_thread.hpp"

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lockstep::detail {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


#if defined(__linux__)
// The kernel's struct sched_attr, first version (48 bytes); glibc before 2.41 does not declare it.
struct SchedAttr {
  std::uint32_t size, policy;
  std::uint64_t flags;
  std::int32_t nice;
  std::uint32_t priority;
  std::uint64_t runtime, deadline, period;
};

bool get_sched_attr(SchedAttr& attr) noexcept {
  attr = SchedAttr{};
  return syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) == 0;
}
#endif

}  // namespace

std::uint64_t time_slice_ns() noexcept {
#if defined(__linux__)
  SchedAttr attr;
  if (get_sched_attr(attr) && attr.policy == SCHED_OTHER) return attr.runtime;
#endif
  return 0;
}

void request_short_time_slice() noexcept {
#if defined(__linux__)
  SchedAttr attr;
  if (!get_sched_attr(attr) || attr.policy != SCHED_OTHER) return;
  attr.size = sizeof attr;
  attr.flags = 0;  // policy and nice as read: only the slice changes
  attr.runtime = kCommThreadSliceNs;
  (void)syscall(SYS_sched_setattr, 0, &attr, 0);  // best effort: a refusal changes nothing
#endif
}

// A collective waiting in the queue, or running.
struct CommThread::Queued final : CommWork {
  explicit Queued(std::function<void()> c) : collective(std::move(c)) {}
  // Spins briefly, then sleeps (Note [Spin, then wait]).
  void wait() override {
    spin_then_wait(done, false);
    if (error) std::rethrow_exception(error);
  }
  // Publishes error, started_s and finished_s with `done`.
  void complete(std::exception_ptr e) {
    error = e;
    done.store(true, std::memory_order_release);
    done.notify_all();
  }
  const std::function<void()> collective;
  std::atomic<bool> done{false};
  std::exception_ptr error;
  double started_s = 0.0;  // set by the thread before complete()
  double finished_s = 0.0;
};

CommThread::~CommThread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::unique_ptr<CommWork> CommThread::submit(std::function<void()> collective) {
  auto work = std::make_shared<Queued>(std::move(collective));
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable())
      thread_ = detail::start_thread("the communication thread", [this] { loop(); });
    queue_.push_back(work);
  }
  cv_.notify_one();
  // The caller owns a handle; the queue keeps the work alive until the thread is done with it.
  // Its timing: the thread's clock readings, and the time the caller blocked in wait().
  struct Handle final : CommWork {
    std::shared_ptr<Queued> work;
    double blocked_s = 0.0;
    void wait() override {
      const double t0 = now_s();
      work->wait();
      blocked_s = now_s() - t0;
    }
    std::optional<CommTiming> timing() override {
      return CommTiming{work->started_s, work->finished_s, blocked_s};
    }
  };
  auto handle = std::make_unique<Handle>();
  handle->work = std::move(work);
  return handle;
}

void CommThread::loop() {
  request_short_time_slice();  // Note [A short time slice for the communication thread]
  for (;;) {
    std::shared_ptr<Queued> work;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    work->started_s = now_s();
    try {
      work->collective();
    } catch (...) {
      error = std::current_exception();
    }
    work->finished_s = now_s();
    work->complete(error);
  }
}

}  // namespace lockstep::detail
