// How busy a device kept with its steps (Note [Device step time] in lockstep/device.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <vector>

#include "common/median.hpp"

namespace lockstep::detail {

// Per step after the first, the device's time for the step over the host's from that step's
// start to the next one's. A step's device time is known once its record is read, which may
// come before the next step starts or after (Note [Deferred step read] in worker_loop.hpp):
// each step's fraction is taken once both are known. The first step is not steady (lazy
// set-up, the loader's first batch); a step followed by eval or a checkpoint is not either, and
// the median leaves those out.
class DeviceBusy {
 public:
  // At step `step`'s start, on the host's clock (seconds).
  void begin_step(std::int64_t step, double now) {
    if (!first_) first_ = step;
    start_s_[step] = now;
    take(step - 1);
  }
  // Once step `step`'s record was read: the device's time for it (Device::device_step_seconds).
  void step_read(std::int64_t step, std::optional<double> device_s) {
    if (!device_s) {  // no fraction for it: its start is not needed any more
      start_s_.erase(start_s_.begin(), start_s_.upper_bound(step));
      return;
    }
    device_s_[step] = *device_s;
    take(step);
  }
  // The median fraction; nullopt with none (a CPU device, or fewer than three steps).
  std::optional<double> median() const {
    if (fractions_.empty()) return std::nullopt;
    return upper_median(fractions_);
  }

 private:
  // Step `step`'s fraction, once its device time and the next step's start are known; then
  // what is older is dropped.
  void take(std::int64_t step) {
    const auto device = device_s_.find(step);
    const auto start = start_s_.find(step), next = start_s_.find(step + 1);
    if (device == device_s_.end() || start == start_s_.end() || next == start_s_.end()) return;
    if (step != first_ && next->second > start->second)
      fractions_.push_back(std::min(1.0, device->second / (next->second - start->second)));
    device_s_.erase(device_s_.begin(), std::next(device));
    start_s_.erase(start_s_.begin(), next);
  }

  std::optional<std::int64_t> first_;     // the run's first step
  std::map<std::int64_t, double> start_s_;   // steps' starts, host clock
  std::map<std::int64_t, double> device_s_;  // steps' device times, once read
  std::vector<double> fractions_;
};

}  // namespace lockstep::detail
