// Optimiser state for one replica, and the learning-rate schedule.
//
// The state (momentum, Adam moments) lives on the replica's device, in the same layout as the
// parameters. Every replica applies the same update to the same averaged gradient, so the
// states stay identical without ever being communicated.
#pragma once

#include <cstdint>

#include "lockstep/config.hpp"
#include "lockstep/device.hpp"

namespace lockstep::detail {

class Optimizer {
 public:
  Optimizer(Device& device, const OptimizerConfig& cfg, std::size_t params);
  // params -= update(grads) at learning rate lr; counts the step.
  void step(float* params, const float* grads, double lr);
  std::int64_t steps_taken() const noexcept { return t_; }

 private:
  Device* device_;
  OptimizerConfig cfg_;
  std::size_t n_;
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
