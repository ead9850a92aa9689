// What a training step tells the host, kept on the device until the step's work is queued.
//
//   StepRecord record(device, reducer.grains());
//   record.reset();                                    // each step, queued
//   device.softmax_cross_entropy(..., record.loss());  // each micro-batch adds to it
//   reducer.sum_grain_squares(i, device, record.grain_sums());
//   device.step_control(record.grain_sums(), grains, clip, record.control());
//   optimizer.apply(..., record.control());            // clip factor and skip read on the device
//   record.start_read();                               // queued: the copy to the host
//   ...                                                // the next step's forward, queued
//   const StepRecord::Host& h = record.read();         // the step's one host sync
//
// Note [One read per step]
//   A GPU runs ahead of its host only while the host does not wait for it (Note [Host syncs] in
//   device.hpp), so the host learns what a step did from one record, read once, after the
//   step's work is queued:
//     - loss: every micro-batch's softmax_cross_entropy adds its loss, correct count and any
//       label error to it, on the device;
//     - grain sums: each bucket's sums of squares (Note [ZeRO-1] in reducer.hpp), once its
//       all-reduce has landed;
//     - control: Device::step_control makes the global norm, the clip factor and the skip flag
//       (non-finite norm) from the grain sums; the optimiser kernels read the last two, so
//       clipping and on_nonfinite: skip need no decision from the host before the update.
//   Then the host reads the record, all-reduces the loss totals and the stop flag on the host,
//   reports, cancels the optimiser's step count if the update was skipped, and acts on a
//   non-finite norm (trainer.on_nonfinite) or a label error (InputError). The read is deferred
//   (Note [Deferred step read] in worker_loop.hpp): the record's copy is queued at the step's
//   end (start_read, Note [Deferred reads] in device.hpp) and collected once the next step's
//   first forward is queued, so the worker keeps two records and steps use them in turn.
//   With ZeRO-1 each rank sums only its own grains; an all-gather of each bucket's grain sums
//   on the device gives every rank all of them before step_control (Note [ZeRO-1] in
//   reducer.hpp). Either way one read per step, at its end, whatever accumulate_steps and the
//   bucket count.
//   A non-finite loss makes its logits' softmax, hence the gradient and its norm, non-finite,
//   so the norm alone decides the skip on every rank alike; the host checks the loss too.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "lockstep/device.hpp"

namespace lockstep::detail {

class StepRecord {
 public:
  // Allocates the record (before the first step): room for `grains` grain sums, and a control
  // per bucket for `buckets` buckets.
  StepRecord(Device& device, std::size_t grains, std::size_t buckets);

  // Zeroes the record on the device (queued).
  void reset();
  LossStats* loss() noexcept { return &header()->loss; }
  StepControl* control() noexcept { return &header()->control; }
  double* grain_sums() noexcept;  // `grains` entries
  std::size_t grains() const noexcept { return grains_; }
  // Bucket i's own skip flag, for updates per bucket (Note [Deferred step read] in
  // worker_loop.hpp): step_control over the grains of the bucket this rank updates. Device
  // memory, written whole each step, never read by the host.
  StepControl* bucket_control(std::size_t i) noexcept { return bucket_controls_.data() + i; }

  struct Host {
    LossStats loss;
    StepControl control;
  };
  // Queues the copy of the record's loss and control to the host, behind the work queued so far.
  void start_read();
  // Waits for start_read()'s copy (not for work queued after it): the one host sync.
  Host& read();

 private:
  struct Header {
    LossStats loss;
    StepControl control;
  };
  Header* header() noexcept { return reinterpret_cast<Header*>(memory_.data()); }

  Device& device_;
  std::size_t grains_;
  DeviceArray<double> memory_;  // the Header, then the grain sums
  std::unique_ptr<HostReadback> readback_;  // of the Header
  DeviceArray<StepControl> bucket_controls_;
  Host host_;
};

// Throws InputError for the label error `stats` holds, if any: the row of one call of
// softmax_cross_entropy (in `where`) and the label, outside [0, classes).
void check_labels(const LossStats& stats, int classes, std::string_view where);

}  // namespace lockstep::detail
