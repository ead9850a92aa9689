// Optimiser state for one replica, and the learning-rate schedule.
//
// The state (momentum, Adam moments) lives on the replica's device. Without ZeRO it has the
// parameters' layout: every replica applies the same update to the same averaged gradient, so
// the states stay identical without ever being communicated. With ZeRO-1 (Note [ZeRO-1] in
// reducer.hpp) an optimiser owns some ranges of the parameter buffer, its shards, and its state
// holds exactly their elements, one range after another.
#pragma once

#include <cstdint>
#include <optional>

#include <span>
#include <string>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/config.hpp"
#include "lockstep/device.hpp"

namespace lockstep::detail {

// Note [Decay groups]
// ~~~~~~~~~~~~~~~~~~~
// optimizer.weight_decay applies to the matrices only (tensors of 2 or more dimensions: linear
// weights and embeddings), not to biases and LayerNorm gains, as nanoGPT and llm.c do (PyTorch:
// two parameter groups). The optimiser keeps this as runs of the parameter buffer, each with a
// flag, and applies each run with or without decay. optimizer.decay_all: true decays every
// tensor, as lockstep did before.
struct DecaySpan {
  std::size_t begin = 0, end = 0;  // elements of the parameter buffer
  bool decay = true;
};

// The runs of a buffer of `params` elements laid out as `tensors` (adjacent runs with the same
// flag merged); one run when `decay_all`.
std::vector<DecaySpan> decay_spans(std::span<const ParamTensor> tensors, std::size_t params,
                                   bool decay_all);

class Optimizer {
 public:
  // `spans` cover the buffer in order (decay_spans()); empty: every element decays. `owned`:
  // the ranges this optimiser updates, in buffer order (ZeRO-1: this rank's shards, possibly
  // none); nullopt: the whole buffer. State is held for the owned elements only.
  Optimizer(Device& device, const OptimizerConfig& cfg, std::size_t params,
            std::vector<DecaySpan> spans = {},
            std::optional<std::vector<ShardRange>> owned = std::nullopt);
  // params -= update(grads) at learning rate lr; counts the step.
  void step(float* params, const float* grads, double lr) {
    begin_step();
    apply(params, grads, lr, 0, n_);
  }
  // The same step in pieces: begin_step() once, then apply() to ranges that together cover the
  // buffer once (the reducer updates each bucket as soon as its all-reduce is done). Every
  // element's update is the same as in step(). With owned ranges, [begin, end) lies in one.
  // With `control` (device memory, Device::step_control) the update scales the gradient by its
  // clip factor and does nothing if it says skip; the host learns of a skip later and calls
  // cancel_step(), so the step count stays that of the updates taken.
  // params_bf16 (not null): the parameters' bf16 copy, same layout, which the same pass writes
  // with the updated [begin, end) rounded to bf16 (Note [bf16 compute] in src/model/ops.hpp).
  void begin_step() noexcept { ++t_; }
  void apply(float* params, const float* grads, double lr, std::size_t begin, std::size_t end,
             const StepControl* control = nullptr, std::uint16_t* params_bf16 = nullptr) {
    apply_at(params, grads + begin, lr, begin, end, control, params_bf16);
  }
  // The same with the gradients of [begin, end) alone: grads[0] is element begin's (ZeRO-2's
  // shard buffer, Note [ZeRO-2] in reducer.hpp).
  void apply_at(float* params, const float* grads, double lr, std::size_t begin,
                std::size_t end, const StepControl* control = nullptr,
                std::uint16_t* params_bf16 = nullptr);
  void cancel_step() noexcept { --t_; }
  std::int64_t steps_taken() const noexcept { return t_; }

  // The state for checkpoints: "momentum" (SGD with momentum), "adamw.m" and "adamw.v"; with
  // owned ranges, their elements only, one range after another.
  std::vector<StateVector> state() const;
  // Bytes of state this optimiser holds on its device.
  std::size_t state_bytes() const noexcept;
  const std::vector<ShardRange>& owned() const noexcept { return owned_; }
  // The names state() returns, without copying anything off the device.
  std::vector<std::string> state_names() const;
  // The device memory of each vector state() returns, in the same order (Note [Snapshots] in
  // snapshot.hpp copies it without a host sync); owned()[i] starts at state_offset(i) in each.
  std::vector<const float*> state_data() const;
  std::size_t state_offset(std::size_t range) const { return offset_.at(range); }
  // Restores the state of the whole buffer (a checkpoint's, as state() returns it without owned
  // ranges), keeping the owned elements, and the step count. Throws InputError naming `source`
  // if the vectors do not match this optimiser.
  void load_state(std::span<const StateVector> state, std::int64_t steps_taken,
                  const std::string& source);

 private:
  // Updates [begin, end) of the buffer, whose state starts at `state_at`; grads[0] is element
  // begin's.
  void update(float* params, const float* grads, double lr, std::size_t begin, std::size_t end,
              double weight_decay, std::size_t state_at, const StepControl* control,
              std::uint16_t* params_bf16);

  Device* device_;
  OptimizerConfig cfg_;
  std::size_t n_;                   // parameters in the whole buffer
  std::vector<ShardRange> owned_;   // the ranges updated, in buffer order
  std::vector<std::size_t> offset_;  // offset_[i]: where owned_[i] starts in the state
  std::size_t held_ = 0;            // state elements per vector: the owned ranges' total
  std::vector<DecaySpan> spans_;   // decay flags, in buffer order
  DeviceArray<float> m_;  // sgd: momentum buffer; adamw: first moment
  DeviceArray<float> v_;  // adamw: second moment
  std::int64_t t_ = 0;
};

// Note [Warm-up] in worker_loop.hpp, for the end of a step: launches, once and on scratch
// memory, every kernel that a step runs after backward (the gradient's grain sums, the step's
// control, the optimiser's update with and without the control, the bf16 conversions when
// `bf16`, the replica hash), with `cfg`'s optimiser. A GPU loads each kernel at its first launch
// (CUDA 13 loads lazily), and a load may wait for every kernel running on the device, NCCL's
// among them: after this, step 1 loads nothing while its collectives run. Touches no state.
void warm_up_step_tail(Device& device, const OptimizerConfig& cfg, bool bf16);

// The learning rate for 0-based optimiser step `step` of `total`.
//   constant:       lr
//   warmup_cosine:  lr * (step + 1) / warmup for step < warmup, then a cosine from lr down to
//                   min_lr at the last step.
double learning_rate(const OptimizerConfig& opt, const ScheduleConfig& schedule, std::int64_t step,
                     std::int64_t total);

}  // namespace lockstep::detail
