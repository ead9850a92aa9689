// Fault injection without code: LOCKSTEP_FAULT=RANK:STEP:KIND (see TrainerHooks in trainer.hpp)
// makes the worker of global rank RANK fail at STEP (1-based):
//   forward  it throws before its forward pass
//   loader   its loader thread throws reading the first sample of that step
//   nan      its last micro-batch's backward writes a NaN into the gradient
//   stall    it stops making progress until the run is aborted (trainer.step_timeout_s)
//   hang     it waits on its device for work that never finishes, as behind a collective whose
//            peer died, until the run is aborted: Note [Abortable waits] in device.hpp
//   slowsave its checkpoint save at STEP pauses 0.5 s after each stage (weights, state,
//            verification, pruning): slow but healthy, which the step timeout must not stop
//   block    it blocks at the end of STEP, where rank 0 writes its checkpoint, and ignores every
//            abort, as a write to a hung file system would: Note [Bounded stop]
//   lost     its device dies (DeviceLost, a device-class failure: Note [Shrink] in recovery.hpp)
//            in the phase a suffix names: lost:forward (the default, before its forward pass),
//            lost:backward (as its last micro-batch's backward begins, before it has handed any
//            bucket to the all-reduce), lost:all-reduce (once the first bucket it handed
//            over has landed, before it hands the next; without overlap, once every bucket
//            has landed: what the survivors hold then does not depend on timing), lost:update (after its optimiser
//            step, before the step's totals are agreed); a further suffix :stuck (lost:stuck,
//            lost:backward:stuck) leaves its thread stuck once the loss is recorded, deaf to
//            every abort, as a driver call on a dead device may never return (Note [Shrink],
//            step 1, in trainer.cpp)
#pragma once

#include <cstdint>
#include <exception>
#include <memory>

#include "lockstep/dataset.hpp"

namespace lockstep {
class Communicator;
class Device;
}

namespace lockstep::detail {

struct Fault {
  enum class Kind { none, forward, loader, nan, stall, block, hang, slowsave, lost };
  // Where the lost fault strikes.
  enum class Phase { forward, backward, all_reduce, update };
  int rank = -1;
  std::int64_t step = 0;
  Kind kind = Kind::none;
  Phase phase = Phase::forward;
  bool stuck = false;  // lost:...:stuck

  bool at(int r, std::int64_t s, Kind k) const { return kind == k && rank == r && step == s; }
  // Whether the lost fault strikes worker `r` at step `s` in `p`; lose_device throws it then.
  bool loses(int r, std::int64_t s, Phase p) const { return at(r, s, Kind::lost) && phase == p; }
  void lose_device(int r, std::int64_t s, Phase p) const;
  // The stuck lost fault: never returns on worker `r` once `error`, its loss, is recorded.
  void after_loss(int r, const std::exception_ptr& error) const;

  // A fault that would never strike is a mistaken test, not a pass: InputError unless the run
  // of `workers` ranks, doing steps (steps_done, last_step], reaches it. Nothing for none.
  void check_reached(int workers, std::int64_t steps_done, std::int64_t last_step) const;

  // The forward, stall and hang faults, where they strike: before the forward pass of `step` on
  // global rank `rank`. A stall returns only by throwing CommAborted, once `comm` is aborted; a
  // hang likewise, from a wait of `device` (Device::wait_until).
  void before_forward(int rank, std::int64_t step, const Communicator& comm,
                      const Device& device) const;
  // The slowsave fault: called after each stage of a checkpoint save of `step`.
  void during_save(int rank, std::int64_t step) const;
  // The block fault, where it strikes: at the end of `step` on global rank `rank`. Never returns.
  void at_end_of_step(int rank, std::int64_t step) const;
  // The data the loader of global rank `rank` reads, resuming after `step_done` steps of
  // `samples_per_step` samples each: `train`, or a wrapper that fails at the loader fault.
  std::shared_ptr<const Dataset> loader_data(std::shared_ptr<const Dataset> train, int rank,
                                             std::int64_t step_done,
                                             std::size_t samples_per_step) const;
};

// LOCKSTEP_FAULT, parsed; Kind::none when unset. InputError when malformed.
Fault fault_from_environment();

}  // namespace lockstep::detail
