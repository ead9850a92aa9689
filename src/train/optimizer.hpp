// Optimiser state for one replica, and the learning-rate schedule.
//
// The state (momentum, Adam moments) lives on the replica's device, in the same layout as the
// parameters. Every replica applies the same update to the same averaged gradient, so the
// states stay identical without ever being communicated.
#pragma once

#include <cstdint>

#include <span>
#include <string>
#include <vector>

#include "lockstep/checkpoint.hpp"
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
  // `spans` cover the buffer in order (decay_spans()); empty: every element decays.
  Optimizer(Device& device, const OptimizerConfig& cfg, std::size_t params,
            std::vector<DecaySpan> spans = {});
  // params -= update(grads) at learning rate lr; counts the step.
  void step(float* params, const float* grads, double lr) {
    begin_step();
    apply(params, grads, lr, 0, n_);
  }
  // The same step in pieces: begin_step() once, then apply() to ranges that together cover the
  // buffer once (the reducer updates each bucket as soon as its all-reduce is done). Every
  // element's update is the same as in step().
  void begin_step() noexcept { ++t_; }
  void apply(float* params, const float* grads, double lr, std::size_t begin, std::size_t end);
  std::int64_t steps_taken() const noexcept { return t_; }

  // The state for checkpoints: "momentum" (SGD with momentum), "adamw.m" and "adamw.v".
  std::vector<StateVector> state() const;
  // The names state() returns, without copying anything off the device.
  std::vector<std::string> state_names() const;
  // Restores what state() returned, and the step count. Throws InputError naming `source` if the
  // vectors do not match this optimiser.
  void load_state(std::span<const StateVector> state, std::int64_t steps_taken,
                  const std::string& source);

 private:
  void update(float* params, const float* grads, double lr, std::size_t begin, std::size_t end,
              double weight_decay);

  Device* device_;
  OptimizerConfig cfg_;
  std::size_t n_;
  std::vector<DecaySpan> spans_;
  DeviceArray<float> m_;  // sgd: momentum buffer; adamw: first moment
  DeviceArray<float> v_;  // adamw: second moment
  std::int64_t t_ = 0;
};

// The learning rate for 0-based optimiser step `step` of `total`.
//   constant:       lr
//   warmup_cosine:  lr * (step + 1) / warmup for step < warmup, then a cosine from lr down to
//                   min_lr at the last step.
double learning_rate(const OptimizerConfig& opt, const ScheduleConfig& schedule, std::int64_t step,
                     std::int64_t total);

}  // namespace lockstep::detail
