// A resource that one thread uses at a time and any thread may abort without waiting for it:
// the holder of an NCCL communicator (Note [NCCL abort] in nccl_comm.cpp). Plain C++, no CUDA,
// so that its tests run without a GPU.
//
// Note [Abort without the lock]
//   NCCL calls on one communicator must not overlap (NCCL's calls are re-entrant, not
//   thread-safe), and an abort from the watchdog or a failing worker must not free the
//   communicator under a worker's call. A mutex held across each call gives both, but then the
//   abort waits for the call to return: when that call blocks (a blocking communicator's
//   ncclGroupEnd waiting for a peer that died), the abort never runs and the bounded stop never
//   fires. So the slot is a word of three bits (inside, abort requested, ended) and abort()
//   never waits:
//   - nobody inside: abort() ends the slot itself, calling `abort_resource` on its thread;
//   - a thread inside: abort() only marks the request, and that thread calls `abort_resource`
//     as it leaves. It must leave soon: the NCCL communicators are non-blocking, so no call made
//     inside waits for a peer (Note [Non-blocking NCCL]).
//   After an abort request, nobody enters again: use() returns false.
#pragma once

#include <atomic>
#include <functional>
#include <utility>

namespace lockstep::cuda {

class AbortableSlot {
 public:
  // `abort_resource` runs once at most, on the thread that ends the slot by an abort.
  explicit AbortableSlot(std::function<void()> abort_resource)
      : abort_resource_(std::move(abort_resource)) {}
  AbortableSlot(const AbortableSlot&) = delete;
  AbortableSlot& operator=(const AbortableSlot&) = delete;

  // Runs f() inside the slot and returns true; false, without running f, once an abort was
  // requested or the slot was released. A second thread waits for the first to leave.
  template <class F>
  bool use(F&& f) {
    if (!enter()) return false;
    Leave leave{*this};
    std::forward<F>(f)();
    return true;
  }

  // Requests the abort; ends the slot now when nobody is inside, else on the holder's way out.
  // Never waits, never throws; idempotent.
  void abort() noexcept {
    unsigned s = state_.load();
    for (;;) {
      if (s & (kAbortRequested | kEnded)) return;
      if (s & kInside) {
        if (state_.compare_exchange_weak(s, s | kAbortRequested)) return;
      } else if (state_.compare_exchange_weak(s, kInside | kAbortRequested | kEnded)) {
        return finish_abort();
      }
    }
  }

  // Ends the slot with end() unless it was aborted; waits for a thread inside to leave. For
  // teardown, when nobody uses the slot any more.
  template <class F>
  void release(F&& end) noexcept {
    unsigned s = state_.load();
    for (;;) {
      if (s & kEnded) return;
      if (s & kInside) {
        state_.wait(s);
        s = state_.load();
      } else if (state_.compare_exchange_weak(s, kInside | kEnded)) {
        std::forward<F>(end)();
        state_.fetch_and(~kInside);
        state_.notify_all();
        return;
      }
    }
  }

  bool abort_requested() const noexcept { return state_.load() & kAbortRequested; }
  bool ended() const noexcept { return state_.load() & kEnded; }

 private:
  static constexpr unsigned kInside = 1, kAbortRequested = 2, kEnded = 4;

  struct Leave {
    AbortableSlot& slot;
    ~Leave() { slot.leave(); }
  };

  bool enter() noexcept {
    unsigned s = state_.load();
    for (;;) {
      if (s & (kAbortRequested | kEnded)) return false;
      if (s & kInside) {
        state_.wait(s);
        s = state_.load();
      } else if (state_.compare_exchange_weak(s, s | kInside)) {
        return true;
      }
    }
  }
  // Leaves; ends the slot by the abort requested meanwhile, if any.
  void leave() noexcept {
    unsigned s = state_.load();
    for (;;) {
      if ((s & kAbortRequested) && !(s & kEnded)) {
        if (state_.compare_exchange_weak(s, s | kEnded)) return finish_abort();
      } else if (state_.compare_exchange_weak(s, s & ~kInside)) {
        state_.notify_all();
        return;
      }
    }
  }
  void finish_abort() noexcept {
    if (abort_resource_) abort_resource_();
    state_.fetch_and(~kInside);
    state_.notify_all();
  }

  std::atomic<unsigned> state_{0};
  std::function<void()> abort_resource_;
};

}  // namespace lockstep::cuda
