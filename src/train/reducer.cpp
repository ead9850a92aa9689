#include "train/reducer.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace lockstep::detail {
namespace {
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
}

std::vector<Bucket> plan_buckets(const Model& model, double cap_mb, double first_cap_mb) {
  const auto& layers = model.layers();
  std::vector<Bucket> buckets;
  Bucket current;
  double cap_bytes = std::min(first_cap_mb, cap_mb) * 1024 * 1024;
  for (std::size_t i = layers.size(); i-- > 0;) {
    const std::size_t n = layers[i]->param_count();
    if (n == 0) continue;
    const std::size_t offset = model.param_offset(i);
    const double bytes = static_cast<double>(n * sizeof(float));
    if (!current.layers.empty() && static_cast<double>(current.bytes()) + bytes > cap_bytes) {
      buckets.push_back(std::move(current));
      current = Bucket{};
      cap_bytes = cap_mb * 1024 * 1024;
    }
    if (current.layers.empty()) current.begin = current.end = offset;
    // Reverse layout: the next layer in backward order starts where this bucket ends.
    if (offset != current.end)
      throw std::logic_error("plan_buckets: parameters are not laid out in reverse layer order");
    current.end = offset + n;
    current.layers.push_back(i);
  }
  if (!current.layers.empty()) buckets.push_back(std::move(current));
  return buckets;
}

Reducer::Reducer(const Model& model, Communicator& comm, float* grads, std::vector<Bucket> buckets,
                 bool overlap, std::vector<TraceEvent>* comm_track)
    : comm_(comm),
      grads_(grads),
      buckets_(std::move(buckets)),
      overlap_(overlap),
      comm_track_(comm_track),
      bucket_of_layer_(model.layers().size(), kNone),
      pending_(buckets_.size(), 0),
      work_(buckets_.size()) {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t layer : buckets_[b].layers) bucket_of_layer_[layer] = b;
  reset();
}

Reducer::~Reducer() { drain(); }

void Reducer::reset() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].layers.size();
  launched_ = 0;
}

void Reducer::layer_ready(std::size_t layer) {
  const std::size_t b = bucket_of_layer_.at(layer);
  if (b == kNone || pending_[b] == 0)
    throw std::logic_error(fmt::format("Reducer: unexpected gradients from layer {}", layer));
  --pending_[b];
  // Start every complete bucket in order; backward order makes them complete in order anyway.
  if (overlap_)
    while (launched_ < buckets_.size() && pending_[launched_] == 0) launch(launched_);
}

void Reducer::launch_remaining() {
  while (launched_ < buckets_.size()) launch(launched_);
}

void Reducer::launch(std::size_t i) {
  const Bucket& b = buckets_[i];
  work_[i] = comm_.all_reduce_async(grads_ + b.begin, b.end - b.begin, ReduceOp::avg);
  launched_ = i + 1;
}

double Reducer::wait(std::size_t i) {
  if (i >= launched_ || !work_[i]) throw std::logic_error("Reducer::wait: bucket not started");
  const double t0 = steady_now_s();
  std::unique_ptr<CommWork> work = std::move(work_[i]);
  work->wait();
  const double blocked = steady_now_s() - t0;
  exposed_s_ += blocked;
  if (work->finished_s > work->started_s) {
    comm_s_ += work->finished_s - work->started_s;
    if (comm_track_)
      comm_track_->push_back({fmt::format("all-reduce bucket {}", i), work->started_s,
                              work->finished_s,
                              fmt::format("\"bucket\": {}, \"bytes\": {}", i, buckets_[i].bytes())});
  }
  return blocked;
}

void Reducer::drain() noexcept {
  for (auto& work : work_) {
    if (!work) continue;
    try {
      work->wait();
    } catch (...) {  // the failure that caused the drain is reported elsewhere
    }
    work.reset();
  }
}

}  // namespace lockstep::detail
