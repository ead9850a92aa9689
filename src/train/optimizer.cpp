#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace lockstep::detail {

std::vector<DecaySpan> decay_spans(std::span<const ParamTensor> tensors, std::size_t params,
                                   bool decay_all) {
  std::vector<DecaySpan> spans;
  if (decay_all) return {{0, params, true}};
  std::vector<DecaySpan> runs;
  for (const ParamTensor& t : tensors) runs.push_back({t.offset, t.offset + t.numel(), t.shape.size() >= 2});
  std::sort(runs.begin(), runs.end(),
            [](const DecaySpan& a, const DecaySpan& b) { return a.begin < b.begin; });
  for (const DecaySpan& r : runs) {
    if (!spans.empty() && spans.back().end == r.begin && spans.back().decay == r.decay)
      spans.back().end = r.end;
    else
      spans.push_back(r);
  }
  return spans;
}

Optimizer::Optimizer(Device& device, const OptimizerConfig& cfg, std::size_t params,
                     std::vector<DecaySpan> spans, std::optional<std::vector<ShardRange>> owned)
    : device_(&device),
      cfg_(cfg),
      n_(params),
      owned_(owned ? std::move(*owned) : std::vector<ShardRange>{{0, params}}),
      spans_(std::move(spans)) {
  std::size_t previous_end = 0;
  for (const ShardRange& r : owned_) {
    if (r.end > n_ || r.begin > r.end || r.begin < previous_end)
      throw std::logic_error("Optimizer: owned ranges out of the buffer or out of order");
    previous_end = r.end;
    offset_.push_back(held_);
    held_ += r.size();
  }
  const bool needs_m = cfg.type == OptimizerKind::adamw || cfg.momentum > 0.0;
  if (needs_m) m_ = DeviceArray<float>(device, held_);
  if (cfg.type == OptimizerKind::adamw) v_ = DeviceArray<float>(device, held_);
}

std::size_t Optimizer::state_bytes() const noexcept {
  return (m_.size() + v_.size()) * sizeof(float);
}

void Optimizer::apply_at(float* params, const float* grads, double lr, std::size_t begin,
                         std::size_t end, const StepControl* control,
                         std::uint16_t* params_bf16) {
  // The owned range holding [begin, end): the last one starting at or before `begin`.
  const auto after = std::upper_bound(
      owned_.begin(), owned_.end(), begin,
      [](std::size_t b, const ShardRange& r) { return b < r.begin; });
  if (after == owned_.begin() || end > std::prev(after)->end)
    throw std::logic_error(fmt::format("Optimizer::apply: [{}, {}) is not owned", begin, end));
  const std::size_t range = static_cast<std::size_t>(after - owned_.begin()) - 1;
  const std::size_t state_at = offset_[range] + (begin - owned_[range].begin);
  if (spans_.empty())
    return update(params, grads, lr, begin, end, cfg_.weight_decay, state_at, control,
                  params_bf16);
  for (const DecaySpan& s : spans_) {
    const std::size_t b = std::max(begin, s.begin), e = std::min(end, s.end);
    if (b < e)
      update(params, grads + (b - begin), lr, b, e, s.decay ? cfg_.weight_decay : 0.0,
             state_at + (b - begin), control, params_bf16);
  }
}

void Optimizer::update(float* params, const float* grads, double lr, std::size_t begin,
                       std::size_t end, double weight_decay, std::size_t state_at,
                       const StepControl* control, std::uint16_t* params_bf16) {
  const float lr_f = static_cast<float>(lr);
  const std::size_t n = end - begin;
  std::uint16_t* bf16 = params_bf16 ? params_bf16 + begin : nullptr;
  auto at = [state_at](DeviceArray<float>& a) { return a.data() ? a.data() + state_at : nullptr; };
  switch (cfg_.type) {
    case OptimizerKind::sgd:
      device_->sgd_step({.momentum = static_cast<float>(cfg_.momentum),
                         .weight_decay = static_cast<float>(weight_decay),
                         .nesterov = cfg_.nesterov},
                        lr_f, params + begin, grads, at(m_), n, control, bf16);
      return;
    case OptimizerKind::adamw:
      device_->adamw_step({.beta1 = static_cast<float>(cfg_.beta1),
                           .beta2 = static_cast<float>(cfg_.beta2),
                           .eps = static_cast<float>(cfg_.eps),
                           .weight_decay = static_cast<float>(weight_decay)},
                          lr_f, t_, params + begin, grads, at(m_), at(v_), n, control,
                          bf16);
      return;
  }
}

std::vector<std::string> Optimizer::state_names() const {
  if (cfg_.type == OptimizerKind::adamw) return {"adamw.m", "adamw.v"};
  return cfg_.momentum > 0.0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
}

std::vector<const float*> Optimizer::state_data() const {
  std::vector<const float*> out;
  for (const std::string& name : state_names()) out.push_back((name == "adamw.v" ? v_ : m_).data());
  return out;
}

std::vector<StateVector> Optimizer::state() const {
  std::vector<StateVector> out;
  for (std::string& name : state_names()) {
    const DeviceArray<float>& buffer = name == "adamw.v" ? v_ : m_;
    out.push_back({std::move(name), buffer.download()});
  }
  return out;
}

void Optimizer::load_state(std::span<const StateVector> state, std::int64_t steps_taken,
                           const std::string& source) {
  const std::vector<std::string> expected = state_names();
  std::vector<std::string> got;
  for (const StateVector& v : state) got.push_back(v.name);
  if (expected != got)
    throw InputError(fmt::format("{}: optimizer state holds [{}], this {} optimizer needs [{}]",
                                 source, fmt::join(got, ", "), to_string(cfg_.type),
                                 fmt::join(expected, ", ")));
  std::vector<float> mine(held_);
  for (const StateVector& v : state) {
    if (v.values.size() != n_)
      throw InputError(fmt::format("{}: optimizer state '{}' has {} values, the model {}", source,
                                   v.name, v.values.size(), n_));
    for (std::size_t i = 0; i < owned_.size(); ++i)
      std::copy(v.values.begin() + static_cast<std::ptrdiff_t>(owned_[i].begin),
                v.values.begin() + static_cast<std::ptrdiff_t>(owned_[i].end),
                mine.begin() + static_cast<std::ptrdiff_t>(offset_[i]));
    DeviceArray<float>& target = v.name == "adamw.v" ? v_ : m_;
    target.upload(mine);
  }
  t_ = steps_taken;
}

void warm_up_step_tail(Device& device, const OptimizerConfig& cfg, bool bf16) {
  constexpr std::size_t n = 64;
  DeviceArray<float> params(device, n), grads(device, n);
  DeviceArray<double> sums(device, 1);
  DeviceArray<StepControl> control(device, 1);
  DeviceArray<std::uint16_t> params_bf16(device, bf16 ? n : 0);
  device.sum_squares_grains(grads.data(), n, n, sums.data());
  device.step_control(sums.data(), 1, cfg.clip_grad_norm, control.data());
  Optimizer optimizer(device, cfg, n);
  optimizer.begin_step();
  optimizer.apply(params.data(), grads.data(), 0.0, 0, n, control.data(), params_bf16.data());
  optimizer.apply(params.data(), grads.data(), 0.0, 0, n, nullptr, params_bf16.data());
  if (bf16) {  // the gradient's wire format (trainer.grad_reduce_dtype) and back
    device.to_bf16(grads.data(), params_bf16.data(), n);
    device.from_bf16(params_bf16.data(), grads.data(), n);
  }
  (void)device.hash(params.data(), n);  // waits for all of it
}

double learning_rate(const OptimizerConfig& opt, const ScheduleConfig& schedule, std::int64_t step,
                     std::int64_t total) {
  switch (schedule.type) {
    case ScheduleKind::constant:
      return opt.lr;
    case ScheduleKind::warmup_cosine: {
      const std::int64_t warmup = schedule.warmup_steps;
      if (step < warmup) return opt.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
      const std::int64_t decay = std::max<std::int64_t>(1, total - warmup - 1);
      const double progress =
          std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay), 0.0, 1.0);
      return schedule.min_lr +
             0.5 * (opt.lr - schedule.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return opt.lr;
}

}  // namespace lockstep::detail
