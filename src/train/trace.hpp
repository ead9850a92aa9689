// A timeline of every worker, written as Chrome trace-event JSON (opens in Perfetto and
// chrome://tracing).
//
// Tracks: "worker r" (forward, backward per layer, optimiser, data and barrier waits) and
// "comm r" (each bucket's all-reduce). Each track is written by one thread only, so recording
// takes no lock; the file is written after every thread has joined.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

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

// Records [construction, destruction) on a track; does nothing when the track is null.
class TraceSpan {
 public:
  TraceSpan(std::vector<TraceEvent>* track, std::string name)
      : track_(track), name_(track ? std::move(name) : std::string()),
        begin_s_(track ? steady_now_s() : 0.0) {}
  ~TraceSpan() {
    if (track_) track_->push_back({std::move(name_), begin_s_, steady_now_s(), {}});
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  std::vector<TraceEvent>* track_;
  std::string name_;
  double begin_s_;
};

}  // namespace lockstep::detail
