// How busy a device kept with its steps (Note [Device step time] in lockstep/device.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace lockstep::detail {

// Per step after the first, the device's time for the step over the host's from that step's
// start to the next one's. The first step is not steady (lazy set-up, the loader's first
// batch); a step followed by eval or a checkpoint is not either, and the median leaves those
// out.
class DeviceBusy {
 public:
  // At each step's start, on the host's clock (seconds).
  void begin_step(double now) {
    if (device_s_ && steps_++ > 0 && now > step_start_s_)
      fractions_.push_back(std::min(1.0, *device_s_ / (now - step_start_s_)));
    device_s_.reset();
    step_start_s_ = now;
  }
  // Once the step's record was read: the device's time for it (Device::device_step_seconds).
  void step_read(std::optional<double> device_s) { device_s_ = device_s; }
  // The median fraction; nullopt with none (a CPU device, or fewer than three steps).
  std::optional<double> median() const {
    if (fractions_.empty()) return std::nullopt;
    std::vector<double> v = fractions_;
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
  }

 private:
  double step_start_s_ = 0.0;
  std::optional<double> device_s_;  // the last step's, once read
  std::int64_t steps_ = 0;          // steps with a device time
  std::vector<double> fractions_;
};

}  // namespace lockstep::detail
