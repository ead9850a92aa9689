// What the CUDA communicators share: waits that poll instead of blocking (Note [Abortable
// waits] in lockstep/device.hpp), and collectives in flight on a comm stream.
//
// Note [Stream work]
//   An async collective on a GPU (Communicator::all_reduce_async and the others) is enqueued on
//   the communicator's comm stream after an event of the compute stream, between two timing
//   events of its own:
//     compute: ... backward of layer L  ready                      ... layer L-1 ...  joined
//     comm:                             wait(ready) start [op] end                      |
//     compute, from wait():                                          waits for end <----+
//   Nothing ties the compute stream to the collective until StreamWork::wait(), which records
//   `joined` on the compute stream and makes it wait for `end`: the host never blocks, backward
//   goes on while the bucket reduces, and only what follows wait() (the bucket's optimiser
//   step) waits for it. Once the GPU has passed `end` and `joined`, timing() reads the events:
//   the collective ran from start to end, and the compute stream stood still from joined until
//   end, when end came later (the exposed time; 0 when it was hidden). Host times come from an
//   EventClock: an event whose host time is known.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/handles.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cuda {

// The predicates Device::wait_until polls. True once every operation queued on `s` so far (or
// before `e` was recorded) has finished; a device error throws CudaError.
bool stream_idle(cudaStream_t s);
bool event_done(cudaEvent_t e);

// For destructors and other paths that must not throw: polls until `s` is idle, or until
// `device`'s abort check says the group was aborted. True when idle: the memory its work uses
// may be freed. False after an abort: the caller leaks that memory rather than free it under a
// kernel that may still run.
bool settle(cudaStream_t s, const Device& device) noexcept;

// Timing events (cudaEventDefault), reused: one collective in flight holds three. Shared by a
// communicator and its works, so that a work may outlive the communicator's other state.
class EventPool {
 public:
  Event take();
  void give(Event event) noexcept;

 private:
  std::mutex mutex_;
  std::vector<Event> free_;
};

// Host times of events recorded on one device: an anchor event whose host time was taken when
// it completed. cudaEventElapsedTime gives float milliseconds, so a position an hour after the
// anchor is known to about half a millisecond; durations are measured between their own
// events, to a microsecond.
class EventClock {
 public:
  // Records the anchor on `stream` and waits for it: once, at set-up.
  explicit EventClock(cudaStream_t stream);
  double host_s(cudaEvent_t e) const;  // e has completed

 private:
  Event anchor_;
  double anchor_s_ = 0.0;
};

// One collective enqueued on a comm stream, as a CommWork (Note [Stream work]).
class StreamWork final : public CommWork {
 public:
  StreamWork(std::shared_ptr<EventPool> pool, std::shared_ptr<const EventClock> clock,
             cudaStream_t compute, std::function<bool()> aborted);
  ~StreamWork() override;
  StreamWork(const StreamWork&) = delete;
  StreamWork& operator=(const StreamWork&) = delete;

  // Enqueued by the communicator on its comm stream, before and after the collective.
  void record_start(cudaStream_t comm);
  void record_end(cudaStream_t comm);
  // The event recorded by record_end, for peers to wait on.
  cudaEvent_t end() const noexcept { return end_.get(); }
  // Another event wait() orders the compute stream after (a peer's end, whose copies read our
  // buffer).
  void also_wait_for(cudaEvent_t e) { others_.push_back(e); }

  void wait() override;
  std::optional<CommTiming> timing() override;

 private:
  std::shared_ptr<EventPool> pool_;
  std::shared_ptr<const EventClock> clock_;
  cudaStream_t compute_;
  std::function<bool()> aborted_;
  Event start_, end_, joined_;
  std::vector<cudaEvent_t> others_;
  bool recorded_ = false;  // false: nothing was enqueued (an empty buffer, a group of one)
  bool waited_ = false;
};

// A communicator's side of Note [Stream work]: its events, its clock, and the work an async
// collective records into while start() enqueues it.
class AsyncCollectives {
 public:
  // At bind(): `compute` is the device's stream, `comm` the communicator's, `aborted` its
  // group's state.
  void bind(cudaStream_t compute, cudaStream_t comm, std::function<bool()> aborted);
  // Runs `collective` (which enqueues) with deferred() set to a new work; returns the work.
  std::unique_ptr<CommWork> start(const std::function<void()>& collective);
  // The async collective being enqueued; null while a plain one is.
  StreamWork* deferred() const noexcept { return deferred_; }

 private:
  cudaStream_t compute_ = nullptr;
  std::function<bool()> aborted_;
  std::shared_ptr<EventPool> pool_ = std::make_shared<EventPool>();
  std::shared_ptr<const EventClock> clock_;
  StreamWork* deferred_ = nullptr;
};

// Returns once `s` is idle; throws CommAborted once `aborted()` is true first (Note [Abortable
// waits] in lockstep/device.hpp), CudaError on a device error. For a communicator's own stream,
// which no Device::wait_until covers.
void wait_for_idle(cudaStream_t s, const std::function<bool()>& aborted);

// Communicator::drain for a comm stream: polls until `comm` on device `device_id` is idle, or
// `give_up()` (after an abort, NCCL's kernels end on their own; a device keeps the memory of a
// stream still busy). Never throws.
void drain_stream(cudaStream_t comm, int device_id, const std::function<bool()>& give_up) noexcept;

}  // namespace lockstep::cuda
