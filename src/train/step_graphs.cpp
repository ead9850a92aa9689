// Note [Step graphs] in step_graphs.hpp.
#include "train/step_graphs.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "common/median.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

// Steps of auto's schedule, counted from the run's first step (0): eager and timed in
// [1, kTimedSteps]; captured in the next two; timed with graphs in the kTimedSteps after; the
// choice at the step after that.
constexpr std::int64_t kFirstCapture = StepGraphs::kTimedSteps + 1;
constexpr std::int64_t kFirstGraphTimed = kFirstCapture + 2;
constexpr std::int64_t kChoice = kFirstGraphTimed + StepGraphs::kTimedSteps;

}  // namespace

StepGraphs::StepGraphs(Device& device, GraphMode mode, std::int64_t first_step,
                       std::int64_t total_steps, bool speaks)
    : device_(device), mode_(mode), first_step_(first_step), speaks_(speaks) {
  if (mode_ == GraphMode::off)
    why_not_ = "trainer.cuda_graphs: off";
  else if (std::string why = device_.graphs_unsupported(); !why.empty())
    why_not_ = std::move(why);
  else if (mode_ == GraphMode::automatic && total_steps - first_step_ < kChoice)
    why_not_ = fmt::format(
        "trainer.cuda_graphs: auto times {} steps each way and needs a run of {} steps; this "
        "one has {} (on captures from the second step)",
        kTimedSteps, kChoice + 1, total_steps - first_step_ + 1);
  times_ = mode_ == GraphMode::automatic && why_not_.empty();
}

StepGraphs::~StepGraphs() = default;

void StepGraphs::turn_off(std::string why) {
  if (why_not_.empty()) {
    why_not_ = std::move(why);
    if (speaks_)
      fmt::print(stderr,
                 "lockstep: note: CUDA graphs off from step {}: {}. The run goes on without them "
                 "(cuda_graphs in the summary).\n",
                 step_, why_not_);
  }
  active_ = false;
  programs_.clear();
}

void StepGraphs::begin_step(std::int64_t step, double now_s, Communicator& comm) {
  step_ = step;
  const std::int64_t s = step - first_step_;
  if (mode_ == GraphMode::on) {
    active_ = why_not_.empty() && s >= 1;
    return;
  }
  if (!times_) return;
  // auto: the step before took now_s - last_begin_s_.
  const std::int64_t before = s - 1;
  if (last_begin_s_ >= 0.0) {
    if (before >= 1 && before <= kTimedSteps) eager_s_.push_back(now_s - last_begin_s_);
    if (before >= kFirstGraphTimed && before < kChoice) graph_s_.push_back(now_s - last_begin_s_);
  }
  last_begin_s_ = now_s;
  active_ = why_not_.empty() && s >= kFirstCapture;
  if (s != kChoice) return;
  // The ranks choose together: every rank that times takes part (the same ranks everywhere,
  // whether or not a capture was refused on some), each with its eager median, and with its
  // graph median where it still has graphs.
  const bool timed = why_not_.empty();
  std::array<double, 4> sums = {upper_median(eager_s_), timed ? upper_median(graph_s_) : 0.0,
                                timed ? 1.0 : 0.0, 1.0};
  comm.all_reduce_host(sums);
  eager_median_s_ = sums[0] / sums[3];
  graph_median_s_ = sums[2] > 0.0 ? sums[1] / sums[2] : 0.0;
  if (!timed) return;
  if (graph_median_s_ < eager_median_s_ && speaks_)
    fmt::print(stderr,
               "lockstep: note: trainer.cuda_graphs: auto measured a step at {:.3f} ms with CUDA "
               "graphs and {:.3f} ms without (medians of {} steps): keeping them.\n",
               1e3 * graph_median_s_, 1e3 * eager_median_s_, kTimedSteps);
  if (graph_median_s_ >= eager_median_s_)
    turn_off(fmt::format(
        "trainer.cuda_graphs: auto measured a step at {:.3f} ms with graphs and {:.3f} ms "
        "without (medians of {} steps)",
        1e3 * graph_median_s_, 1e3 * eager_median_s_, kTimedSteps));
}

void StepGraphs::run(const Key& key, const std::function<void(const Layer&)>& enqueue,
                     const Layer& on_layer, const std::function<bool(std::size_t)>& cut) {
  const bool first_run = seen_.insert(key).second;
  if (!active_) {
    enqueue(on_layer);
    return;
  }
  const auto eagerly = [&] {
    enqueue(on_layer);
    ++eager_;
  };
  if (first_run || refused_.contains(key)) return eagerly();
  auto it = programs_.find(key);
  if (it != programs_.end() &&
      !std::all_of(it->second.begin(), it->second.end(),
                   [](const Segment& s) { return !s.graph || s.graph->valid(); })) {
    programs_.clear();  // memory they use was replaced: capture again
    it = programs_.end();
  }
  if (it == programs_.end()) {
    if (programs_.size() >= kMaxPrograms) return eagerly();
    Program program;
    std::string why;
    if (!capture(enqueue, static_cast<bool>(on_layer), cut, program, why)) {
      if (captured_ == 0) {
        turn_off(fmt::format("a capture was refused, so every part runs as launched: {}", why));
        enqueue(on_layer);
        return;
      }
      // Graphs work here: only this key runs as launched from now on.
      refused_.insert(key);
      if (refusal_.empty()) refusal_ = why;
      return eagerly();
    }
    it = programs_.emplace(key, std::move(program)).first;
    ++captured_;
  }
  launch(it->second, on_layer);
}

// Records the part, cutting it after each layer cut() names. False: an op refused the
// capture, which is dropped (nothing ran); `why` says which.
bool StepGraphs::capture(const std::function<void(const Layer&)>& enqueue, bool reports,
                         const std::function<bool(std::size_t)>& cut, Program& program,
                         std::string& why) {
  Segment current;
  try {
    device_.begin_capture();
    const Layer report = [&](std::size_t layer) {
      current.layers.push_back(layer);
      if (!cut(layer)) return;
      current.graph = device_.end_capture();
      program.push_back(std::move(current));
      current = Segment{};
      device_.begin_capture();
    };
    enqueue(reports ? report : Layer{});
    current.graph = device_.end_capture();
    program.push_back(std::move(current));
    return true;
  } catch (const CommAborted&) {
    device_.abort_capture();
    throw;
  } catch (const std::exception& e) {
    device_.abort_capture();
    program.clear();
    why = e.what();
    return false;
  }
}

void StepGraphs::launch(const Program& program, const Layer& on_layer) {
  for (const Segment& segment : program) {
    if (segment.graph) segment.graph->launch();
    if (on_layer)
      for (const std::size_t layer : segment.layers) on_layer(layer);
  }
  ++launched_;
}

Summary::Graphs StepGraphs::summary() const {
  return {.used = why_not_.empty() && captured_ > 0,
          .why_not = why_not_,
          .eager_step_s = eager_median_s_,
          .graph_step_s = graph_median_s_,
          .captured = captured_,
          .launched = launched_,
          .eager = eager_,
          .refused = refused_.size(),
          .refusal = refusal_};
}

}  // namespace lockstep::detail
