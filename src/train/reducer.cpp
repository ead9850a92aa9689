#include "train/reducer.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "common/nvtx_range.hpp"

namespace lockstep::detail {
namespace {
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// A collective that ran to completion on the caller's thread.
// A collective that ran inline: over before it was returned, the worker blocked all along.
struct Finished final : CommWork {
  explicit Finished(CommTiming t) : timing_(t) {}
  void wait() override {}
  std::optional<CommTiming> timing() override { return timing_; }
  CommTiming timing_;
};
}  // namespace

const char* to_string(CommMode mode) noexcept {
  return mode == CommMode::async ? "async" : "inline";
}

CommMode choose_comm_mode(bool cores_scarce, int ranks, std::size_t buckets) {
  if (const char* forced = std::getenv("LOCKSTEP_COMM_MODE"); forced && *forced) {
    if (!std::strcmp(forced, "async")) return CommMode::async;
    if (!std::strcmp(forced, "inline")) return CommMode::inline_;
    throw InputError(fmt::format("LOCKSTEP_COMM_MODE: expected async or inline, got '{}'", forced));
  }
  if (ranks == 1) return CommMode::inline_;  // nothing to communicate, nothing to overlap
  return cores_scarce && buckets <= 1 ? CommMode::inline_ : CommMode::async;
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

Reducer::Reducer(const Model& model, Communicator& comm, Device& device, float* grads,
                 std::vector<Bucket> buckets, bool overlap, bool zero, CommMode mode,
                 ReduceDtype dtype, std::vector<TraceEvent>* comm_track)
    : comm_(comm),
      device_(device),
      grads_(grads),
      buckets_(std::move(buckets)),
      overlap_(overlap),
      zero_(zero),
      mode_(mode),
      comm_track_(comm_track),
      bucket_of_layer_(model.layers().size(), kNone),
      pending_(buckets_.size(), 0),
      work_(buckets_.size()) {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t layer : buckets_[b].layers) bucket_of_layer_[layer] = b;
  first_grain_.push_back(0);
  for (const Bucket& b : buckets_)
    first_grain_.push_back(first_grain_.back() + (b.end - b.begin + kZeroGrain - 1) / kZeroGrain);
  if (dtype == ReduceDtype::bf16) {
    if (zero_) throw std::logic_error("Reducer: bf16 reduction with ZeRO-1 is not implemented");
    std::size_t end = 0;
    for (const Bucket& b : buckets_) end = std::max(end, b.end);
    wire_ = DeviceArray<std::uint16_t>(device_, end);
  }
  reset();
}

std::size_t Reducer::bytes_per_step() const noexcept {
  std::size_t elements = 0;
  for (const Bucket& b : buckets_) elements += b.end - b.begin;
  return elements * (wire_.size() > 0 ? sizeof(std::uint16_t) : sizeof(float));
}

std::size_t Reducer::wire_bytes(std::size_t i) const noexcept {
  return buckets_[i].bytes() / (wire_.size() > 0 ? 2 : 1);
}

Reducer::~Reducer() { drain(); }

void Reducer::reset() {
  collect_timings();  // of earlier steps' collectives the device has finished
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].layers.size();
  launched_ = 0;
}

void Reducer::layer_ready(std::size_t layer) {
  const std::size_t b = bucket_of_layer_.at(layer);
  if (b == kNone || pending_[b] == 0)
    throw std::logic_error(fmt::format("Reducer: unexpected gradients from layer {}", layer));
  --pending_[b];
  // Start every complete bucket in order; backward order makes them complete in order anyway.
  // Inline, they start after backward (Note [Inline collectives]).
  if (overlap_ && mode_ == CommMode::async)
    while (launched_ < buckets_.size() && pending_[launched_] == 0) launch(launched_);
}

Reducer::DryRun Reducer::dry_run() const {
  DryRun dry;
  for (const Bucket& b : buckets_) dry.pending.push_back(b.layers.size());
  return dry;
}

bool Reducer::dry_layer_ready(DryRun& dry, std::size_t layer) const {
  const std::size_t b = bucket_of_layer_.at(layer);
  if (b == kNone || dry.pending.at(b) == 0)
    throw std::logic_error(fmt::format("Reducer: unexpected gradients from layer {}", layer));
  --dry.pending[b];
  if (!overlap_ || mode_ != CommMode::async) return false;
  const std::size_t before = dry.launched;
  while (dry.launched < buckets_.size() && dry.pending[dry.launched] == 0) ++dry.launched;
  return dry.launched != before;
}

void Reducer::launch_remaining() {
  while (launched_ < buckets_.size()) launch(launched_);
}

void Reducer::launch(std::size_t i) {
  const NvtxRange range(zero_ ? "reduce-scatter bucket " : "all-reduce bucket ", i);
  const Bucket& b = buckets_[i];
  float* data = grads_ + b.begin;
  const std::size_t count = b.end - b.begin;
  launched_ = i + 1;
  if (wire_.size() > 0) {  // Note [bf16 gradient reduction]
    std::uint16_t* wire = wire_.data() + b.begin;
    device_.to_bf16(data, wire, count);
    work_[i] = start([&] { return comm_.all_reduce_bf16_async(wire, count, ReduceOp::avg); },
                     [&] { comm_.all_reduce_bf16(wire, count, ReduceOp::avg); });
  } else if (zero_)
    work_[i] =
        start([&] { return comm_.reduce_scatter_async(data, count, kZeroGrain, ReduceOp::avg); },
              [&] { comm_.reduce_scatter(data, count, kZeroGrain, ReduceOp::avg); });
  else
    work_[i] = start([&] { return comm_.all_reduce_async(data, count, ReduceOp::avg); },
                     [&] { comm_.all_reduce(data, count, ReduceOp::avg); });
}

// Inline, the worker is blocked for the whole collective: all of it is exposed (counted when it
// is waited for, as any collective's timing).
std::unique_ptr<CommWork> Reducer::start(std::function<std::unique_ptr<CommWork>()> async,
                                         const std::function<void()>& blocking) {
  if (mode_ == CommMode::async) return async();
  CommTiming t;
  t.started_s = steady_now_s();
  blocking();
  t.finished_s = steady_now_s();
  t.exposed_s = t.finished_s - t.started_s;
  return std::make_unique<Finished>(t);
}

ShardRange Reducer::shard(std::size_t i) const {
  const Bucket& b = buckets_.at(i);
  if (!zero_) return {b.begin, b.end};
  const ShardRange s = shard_range(b.end - b.begin, comm_.size(), comm_.rank(), kZeroGrain);
  return {b.begin + s.begin, b.begin + s.end};
}

std::vector<ShardRange> Reducer::owned() const {
  std::vector<ShardRange> out;
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (const ShardRange s = shard(i); s.size() > 0) out.push_back(s);
  return out;
}

ShardRange Reducer::shard_grains(std::size_t i) const {
  const ShardRange mine = shard(i);  // starts on a grain of the bucket
  const std::size_t first = first_grain_[i] + (mine.begin - buckets_[i].begin) / kZeroGrain;
  return {first, first + (mine.size() + kZeroGrain - 1) / kZeroGrain};
}

void Reducer::sum_grain_squares(std::size_t i, Device& device, double* sums) const {
  const ShardRange mine = shard(i);
  if (mine.size() > 0) device.sum_squares_grains(grads_ + mine.begin, mine.size(), kZeroGrain,
                                                 sums + shard_grains(i).begin);
}

void Reducer::share_grain_sums(double* sums) {
  if (!zero_) return;
  static_assert(sizeof(double) == 2 * sizeof(float));
  std::vector<std::unique_ptr<CommWork>> shares;
  shares.reserve(buckets_.size());
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    // A grain of 2 floats per sum splits the 2 x grains floats as the bucket's grains split.
    float* data = reinterpret_cast<float*>(sums + first_grain_[i]);
    const std::size_t count = 2 * (first_grain_[i + 1] - first_grain_[i]);
    shares.push_back(start([&] { return comm_.all_gather_async(data, count, 2); },
                           [&] { comm_.all_gather(data, count, 2); }));
  }
  // Each one is waited for, even after one failed: none may still write into `sums` once this
  // returns. They are a few bytes per bucket and stay out of the reducer's timings.
  std::exception_ptr failed;
  for (auto& share : shares) {
    try {
      share->wait();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void Reducer::start_gather(std::size_t i, float* params) {
  const Bucket& b = buckets_.at(i);
  float* data = params + b.begin;
  const std::size_t count = b.end - b.begin;
  gathers_.emplace_back(i, start([&] { return comm_.all_gather_async(data, count, kZeroGrain); },
                                 [&] { comm_.all_gather(data, count, kZeroGrain); }));
}

double Reducer::wait(std::size_t i) {
  if (i >= launched_ || !work_[i]) throw std::logic_error("Reducer::wait: bucket not started");
  const char* what = zero_ ? "reduce-scatter" : "all-reduce";
  const double blocked = wait_for(std::move(work_[i]), what, i);
  if (wire_.size() > 0) {
    const Bucket& b = buckets_[i];
    device_.from_bf16(wire_.data() + b.begin, grads_ + b.begin, b.end - b.begin);
  }
  return blocked;
}

double Reducer::wait_gathers() {
  double blocked = 0.0;
  for (auto& [i, work] : gathers_) blocked += wait_for(std::move(work), "all-gather", i);
  gathers_.clear();
  return blocked;
}

// Waits for one collective of bucket i; its time is counted once known (collect_timings).
double Reducer::wait_for(std::unique_ptr<CommWork> work, const char* what, std::size_t i) {
  const double t0 = steady_now_s();
  work->wait();
  const double blocked = steady_now_s() - t0;
  untimed_.push_back({std::move(work), what, i});
  collect_timings();
  return blocked;
}

void Reducer::collect_timings() {
  std::erase_if(untimed_, [this](Untimed& u) {
    const std::optional<CommTiming> t = u.work->timing();
    if (!t) return false;
    exposed_s_ += t->exposed_s;
    if (t->finished_s > t->started_s) {
      comm_s_ += t->finished_s - t->started_s;
      if (comm_track_)
        comm_track_->push_back({fmt::format("{} bucket {}", u.what, u.bucket), t->started_s,
                                t->finished_s,
                                fmt::format("\"bucket\": {}, \"bytes\": {}", u.bucket,
                                            wire_bytes(u.bucket))});
    }
    return true;
  });
}

void Reducer::drain() noexcept {
  auto finish = [](std::unique_ptr<CommWork>& work) {
    if (!work) return;
    try {
      work->wait();
    } catch (...) {  // the failure that caused the drain is reported elsewhere
    }
    work.reset();
  };
  for (auto& work : work_) finish(work);
  for (auto& gather : gathers_) finish(gather.second);
  gathers_.clear();
  untimed_.clear();
}

}  // namespace lockstep::detail
