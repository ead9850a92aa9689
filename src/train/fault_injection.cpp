#include "train/fault_injection.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

// A dataset whose get() fails once the loader thread reaches the `fail_at`-th sample it reads:
// the loader fault.
class FailingDataset final : public Dataset {
 public:
  FailingDataset(std::shared_ptr<const Dataset> inner, std::size_t fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  std::size_t size() const noexcept override { return inner_->size(); }
  int features() const noexcept override { return inner_->features(); }
  int classes() const noexcept override { return inner_->classes(); }
  int targets() const noexcept override { return inner_->targets(); }
  void get(std::size_t i, float* x, std::int32_t* y) const override {
    if (reads_.fetch_add(1) >= fail_at_)
      throw std::runtime_error(fmt::format("injected fault: the loader failed reading sample {}", i));
    inner_->get(i, x, y);
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  std::size_t fail_at_;
  mutable std::atomic<std::size_t> reads_{0};
};

}  // namespace

void Fault::before_forward(int r, std::int64_t s, const Communicator& comm,
                           const Device& device) const {
  if (at(r, s, Kind::forward))
    throw std::runtime_error(fmt::format("injected fault: throw in forward at step {}", s));
  if (at(r, s, Kind::stall)) {
    // A worker that stops making progress, until the step timeout aborts the run.
    while (!comm.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    throw CommAborted();
  }
  if (at(r, s, Kind::hang)) device.wait_until([] { return false; });
}

void Fault::lose_device(int r, std::int64_t s, Phase p) const {
  static constexpr const char* kPhases[] = {"forward", "backward", "all-reduce", "update"};
  if (loses(r, s, p))
    throw DeviceLost(fmt::format("injected fault: the device was lost in {} at step {}",
                                 kPhases[static_cast<int>(p)], s));
}

void Fault::after_loss(int r, const std::exception_ptr& error) const {
  if (kind != Kind::lost || !stuck || rank != r) return;
  try {
    std::rethrow_exception(error);
  } catch (const DeviceLost&) {
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  } catch (...) {
  }
}

void Fault::during_save(int r, std::int64_t s) const {
  if (at(r, s, Kind::slowsave)) std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

void Fault::at_end_of_step(int r, std::int64_t s) const {
  if (!at(r, s, Kind::block)) return;
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

std::shared_ptr<const Dataset> Fault::loader_data(std::shared_ptr<const Dataset> train, int r,
                                                  std::int64_t step_done,
                                                  std::size_t samples_per_step) const {
  if (kind != Kind::loader || rank != r || step <= step_done) return train;
  return std::make_shared<FailingDataset>(
      std::move(train), static_cast<std::size_t>(step - step_done - 1) * samples_per_step);
}

void Fault::check_reached(int workers, std::int64_t steps_done, std::int64_t last_step) const {
  if (kind == Kind::none) return;
  const char* spec = std::getenv("LOCKSTEP_FAULT");
  if (rank >= workers)
    throw InputError(fmt::format("LOCKSTEP_FAULT {}: rank {} is outside the run's ranks 0..{}",
                                 spec ? spec : "", rank, workers - 1));
  if (step <= steps_done || step > last_step)
    throw InputError(fmt::format("LOCKSTEP_FAULT {}: step {} is outside the run's steps {}..{}",
                                 spec ? spec : "", step, steps_done + 1, last_step));
}

Fault fault_from_environment() {
  const char* spec = std::getenv("LOCKSTEP_FAULT");
  if (!spec || !*spec) return {};
  Fault f;
  char kind[24] = {};
  long long step = 0;
  const auto bad = [&] {
    return InputError(fmt::format(
        "LOCKSTEP_FAULT: expected RANK:STEP:KIND with KIND one of forward, loader, nan, stall, "
        "block, hang, slowsave, lost (or lost:PHASE with PHASE one of forward, backward, "
        "all-reduce, update; either may end in :stuck), got '{}'", spec));
  };
  if (std::sscanf(spec, "%d:%lld:%23s", &f.rank, &step, kind) != 3 || f.rank < 0 || step < 1)
    throw bad();
  f.step = step;
  std::string k = kind;
  if (k.starts_with("lost") && k.ends_with(":stuck")) {
    f.stuck = true;
    k.resize(k.size() - 6);
  }
  if (k.starts_with("lost:")) {
    const std::string phase = k.substr(5);
    if (phase == "forward") f.phase = Fault::Phase::forward;
    else if (phase == "backward") f.phase = Fault::Phase::backward;
    else if (phase == "all-reduce") f.phase = Fault::Phase::all_reduce;
    else if (phase == "update") f.phase = Fault::Phase::update;
    else throw bad();
    k = "lost";
  }
  if (k == "forward") f.kind = Fault::Kind::forward;
  else if (k == "loader") f.kind = Fault::Kind::loader;
  else if (k == "nan") f.kind = Fault::Kind::nan;
  else if (k == "stall") f.kind = Fault::Kind::stall;
  else if (k == "block") f.kind = Fault::Kind::block;
  else if (k == "hang") f.kind = Fault::Kind::hang;
  else if (k == "slowsave") f.kind = Fault::Kind::slowsave;
  else if (k == "lost") f.kind = Fault::Kind::lost;
  else throw bad();
  return f;
}

}  // namespace lockstep::detail
