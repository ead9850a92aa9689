// See Note [Stream work] in stream_work.hpp.
#include "cuda/stream_work.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <utility>

#include "cuda/check.hpp"

namespace lockstep::cuda {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// cudaErrorNotReady is an answer, not a failure; it is cleared from the last error so that a
// later launch check does not report it (as PyTorch's event query does).
bool ready(cudaError_t status, const char* call) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  check(status, call, __FILE__, __LINE__);
  return true;
}

// Milliseconds from a to b, both completed.
float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

}  // namespace

bool stream_idle(cudaStream_t s) { return ready(cudaStreamQuery(s), "cudaStreamQuery"); }

bool event_done(cudaEvent_t e) { return ready(cudaEventQuery(e), "cudaEventQuery"); }

bool settle(cudaStream_t s, const Device& device) noexcept {
  try {
    device.wait_until([s] { return stream_idle(s); });
    return true;
  } catch (...) {  // aborted, or the device failed: either way its work may not be done
    return false;
  }
}

Event EventPool::take() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      Event e = std::move(free_.back());
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));  // with timing
  return Event(e);
}

void EventPool::give(Event event) noexcept {
  if (!event) return;
  std::lock_guard lock(mutex_);
  try {
    free_.push_back(std::move(event));
  } catch (...) {  // no memory to keep it: it is destroyed instead
  }
}

EventClock::EventClock(cudaStream_t stream) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));
  anchor_ = Event(e);
  CUDA_CHECK(cudaEventRecord(e, stream));
  CUDA_CHECK(cudaEventSynchronize(e));  // at set-up, before any collective
  anchor_s_ = now_s();
}

double EventClock::host_s(cudaEvent_t e) const {
  return anchor_s_ + 1e-3 * static_cast<double>(elapsed_ms(anchor_.get(), e));
}

StreamWork::StreamWork(std::shared_ptr<EventPool> pool, std::shared_ptr<const EventClock> clock,
                       cudaStream_t compute, std::function<bool()> aborted)
    : pool_(std::move(pool)),
      clock_(std::move(clock)),
      compute_(compute),
      aborted_(std::move(aborted)),
      start_(pool_->take()),
      end_(pool_->take()),
      joined_(pool_->take()) {}

StreamWork::~StreamWork() {
  // An event may be recorded again while a stream still waits on its earlier record: the wait
  // keeps that record. So the events go back now, done or not.
  pool_->give(std::move(start_));
  pool_->give(std::move(end_));
  pool_->give(std::move(joined_));
}

void StreamWork::record_start(cudaStream_t comm) {
  CUDA_CHECK(cudaEventRecord(start_.get(), comm));
}

void StreamWork::record_end(cudaStream_t comm) {
  CUDA_CHECK(cudaEventRecord(end_.get(), comm));
  recorded_ = true;
}

void StreamWork::wait() {
  if (aborted_()) throw CommAborted();
  if (!recorded_ || waited_) return;
  CUDA_CHECK(cudaEventRecord(joined_.get(), compute_));
  CUDA_CHECK(cudaStreamWaitEvent(compute_, end_.get(), 0));
  for (cudaEvent_t e : others_) CUDA_CHECK(cudaStreamWaitEvent(compute_, e, 0));
  waited_ = true;
}

std::optional<CommTiming> StreamWork::timing() {
  if (!recorded_) return CommTiming{};
  if (!waited_ || !event_done(end_.get()) || !event_done(joined_.get())) return std::nullopt;
  const double started_s = clock_->host_s(start_.get());
  const double run_s = 1e-3 * static_cast<double>(elapsed_ms(start_.get(), end_.get()));
  const double stood_s = 1e-3 * static_cast<double>(elapsed_ms(joined_.get(), end_.get()));
  return CommTiming{started_s, started_s + run_s, std::max(0.0, stood_s)};
}

void AsyncCollectives::bind(cudaStream_t compute, cudaStream_t comm,
                            std::function<bool()> aborted) {
  compute_ = compute;
  aborted_ = std::move(aborted);
  clock_ = std::make_shared<EventClock>(comm);
}

std::unique_ptr<CommWork> AsyncCollectives::start(const std::function<void()>& collective) {
  if (!compute_) throw std::logic_error("async collective: attach() was not called");
  auto work = std::make_unique<StreamWork>(pool_, clock_, compute_, aborted_);
  struct Undefer {
    StreamWork*& deferred;
    ~Undefer() { deferred = nullptr; }
  } undefer{deferred_};
  deferred_ = work.get();
  collective();
  return work;
}

void wait_for_idle(cudaStream_t s, const std::function<bool()>& aborted) {
  while (!stream_idle(s)) {
    if (aborted()) throw CommAborted();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void drain_stream(cudaStream_t comm, int device_id, const std::function<bool()>& give_up) noexcept {
  if (!comm) return;
  DeviceGuard guard(device_id);
  while (!give_up()) {
    try {
      if (stream_idle(comm)) return;
    } catch (...) {  // a device error: the stream will not become idle
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace lockstep::cuda
