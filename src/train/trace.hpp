// A timeline of every worker, written as Chrome trace-event JSON (opens in Perfetto and
// chrome://tracing).
//
// Tracks: "worker r" (forward, backward per layer, optimiser, the waits for data, for each
// bucket's reduction and at barriers) and
// "comm r" (each bucket's all-reduce). Each track is written by one thread only, so recording
// takes no lock; the file is written after every thread has joined.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/nvtx_range.hpp"

namespace lockstep::detail {

double steady_now_s();

struct TraceEvent {
  std::string name;
  double begin_s;
  double end_s;
  std::string args;  // a JSON object's members, e.g. "\"bytes\": 4096"; may be empty
};

class Trace {
 public:
  // Tracks 0..workers-1 are the workers, workers..2*workers-1 their communication threads.
  Trace(int workers, bool enabled);
  bool enabled() const noexcept { return enabled_; }
  std::vector<TraceEvent>* worker(int rank) { return enabled_ ? &tracks_[rank] : nullptr; }
  std::vector<TraceEvent>* comm(int rank) { return enabled_ ? &tracks_[workers_ + rank] : nullptr; }
  // Times are shown relative to `origin_s`.
  void write_json(const std::filesystem::path& file, double origin_s) const;

 private:
  int workers_;
  bool enabled_;
  std::vector<std::vector<TraceEvent>> tracks_;
};

// Records [construction, destruction) on a track, with the optimiser step it belongs to
// (`step` >= 0) as its argument, when the track is not null; and as an NVTX range for Nsight
// always (Note [NVTX ranges]).
class TraceSpan {
 public:
  TraceSpan(std::vector<TraceEvent>* track, std::string name, std::int64_t step = -1)
      : track_(track), name_(std::move(name)), step_(step),
        begin_s_(track ? steady_now_s() : 0.0), range_(name_.c_str()) {}
  ~TraceSpan() {
    if (track_)
      track_->push_back({std::move(name_), begin_s_, steady_now_s(),
                         step_ >= 0 ? "\"step\": " + std::to_string(step_) : std::string()});
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  std::vector<TraceEvent>* track_;
  std::string name_;
  std::int64_t step_;
  double begin_s_;
  NvtxRange range_;
};

}  // namespace lockstep::detail
