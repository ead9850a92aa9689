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

// Backward's order (layers last to first), the bucket each layer with gradients writes into:
// its own, or for a tied layer the tied layer's.
namespace {
std::vector<std::size_t> writes_in_backward_order(const Model& model,
                                                  const std::vector<std::size_t>& bucket_of_layer) {
  std::vector<std::size_t> order;
  const auto& layers = model.layers();
  for (std::size_t i = layers.size(); i-- > 0;) {
    const int tied = layers[i]->tied_to();
    const std::size_t owner = tied >= 0 ? static_cast<std::size_t>(tied) : i;
    if (layers[owner]->param_count() > 0) order.push_back(bucket_of_layer[owner]);
  }
  return order;
}

std::vector<std::size_t> bucket_of_layers(const Model& model, const std::vector<Bucket>& buckets) {
  std::vector<std::size_t> of(model.layers().size(), kNone);
  for (std::size_t b = 0; b < buckets.size(); ++b)
    for (std::size_t layer : buckets[b].layers) of[layer] = b;
  return of;
}

// Alignment kept in a bucket's buffer, floats: 64 bytes (Note [ZeRO-2]).
constexpr std::size_t kSlotAlign = 16;
}  // namespace

GradientSlots plan_gradient_slots(const Model& model, const std::vector<Bucket>& buckets) {
  const std::vector<std::size_t> order =
      writes_in_backward_order(model, bucket_of_layers(model, buckets));
  // When each bucket is first written, and when its last layer's write comes (it is full).
  std::vector<std::size_t> opens(buckets.size(), kNone), full(buckets.size(), 0);
  for (std::size_t t = 0; t < order.size(); ++t) {
    if (opens[order[t]] == kNone) opens[order[t]] = t;
    full[order[t]] = t;
  }
  GradientSlots slots;
  slots.at.assign(buckets.size(), 0);
  slots.retires.assign(buckets.size(), GradientSlots::kNone);
  std::vector<std::size_t> rotating;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const std::size_t padded = buckets[b].end - buckets[b].begin + kSlotAlign;
    if (b > 0 && opens[b] < full[b - 1]) {  // held: a buffer of its own
      slots.at[b] = slots.floats + buckets[b].begin % kSlotAlign;
      slots.floats += padded;
      ++slots.held;
    } else {
      rotating.push_back(b);
    }
  }
  // Two buffers, the even and the odd rotating buckets', each as large as the largest of its own.
  std::size_t largest[2] = {0, 0};
  for (std::size_t k = 0; k < rotating.size(); ++k) {
    const Bucket& b = buckets[rotating[k]];
    largest[k % 2] = std::max(largest[k % 2], b.end - b.begin + kSlotAlign);
  }
  for (std::size_t k = 0; k < rotating.size(); ++k) {
    const std::size_t b = rotating[k];
    slots.at[b] = slots.floats + (k % 2) * largest[0] + buckets[b].begin % kSlotAlign;
    if (k >= 2) slots.retires[b] = rotating[k - 2];
  }
  slots.floats += largest[0] + largest[1];
  return slots;
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
      bucket_of_layer_(bucket_of_layers(model, buckets_)),
      pending_(buckets_.size(), 0),
      work_(buckets_.size()) {
  first_grain_.push_back(0);
  for (const Bucket& b : buckets_)
    first_grain_.push_back(first_grain_.back() + (b.end - b.begin + kZeroGrain - 1) / kZeroGrain);
  if (!grads_) {  // ZeRO-2: Note [ZeRO-2]
    if (!zero_) throw std::logic_error("Reducer: no gradient buffer without ZeRO");
    for (std::size_t i = 0; i < model.layers().size(); ++i) {
      const int tied = model.layers()[i]->tied_to();
      grads_of_layer_.push_back(model.param_offset(tied >= 0 ? static_cast<std::size_t>(tied) : i));
    }
    slots_ = plan_gradient_slots(model, buckets_);
    arena_ = DeviceArray<float>(device_, slots_.floats);
    std::size_t held = 0;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      shard_at_.push_back(held);
      held += shard(i).size();
    }
    shards_ = DeviceArray<float>(device_, held);
    opened_.assign(buckets_.size(), 0);
    retired_.assign(buckets_.size(), 0);
  }
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
  std::fill(opened_.begin(), opened_.end(), 0);
  std::fill(retired_.begin(), retired_.end(), 0);
}

std::size_t Reducer::gradient_bytes() const noexcept {
  return (arena_.size() + shards_.size()) * sizeof(float);
}

float* Reducer::bucket_data(std::size_t i) {
  return grads_ ? grads_ + buckets_[i].begin : arena_.data() + slots_.at[i];
}

const float* Reducer::shard_gradients(std::size_t i) const {
  return grads_ ? grads_ + shard(i).begin : shards_.data() + shard_at_.at(i);
}

float* Reducer::gradient_target(std::size_t layer) { return target(layer, /*open=*/true); }
float* Reducer::warm_up_target(std::size_t layer) { return target(layer, /*open=*/false); }

float* Reducer::target(std::size_t layer, bool open) {
  if (grads_) throw std::logic_error("Reducer: gradient targets are ZeRO-2's");
  const std::size_t offset = grads_of_layer_.at(layer);
  const std::size_t b = std::upper_bound(buckets_.begin(), buckets_.end(), offset,
                                         [](std::size_t o, const Bucket& x) { return o < x.end; }) -
                        buckets_.begin();
  if (b == buckets_.size() || offset < buckets_[b].begin)
    throw std::logic_error(fmt::format("Reducer: layer {} writes into no bucket", layer));
  if (open && !opened_[b]) {
    if (const std::size_t before = slots_.retires[b]; before != GradientSlots::kNone)
      retire(before);
    device_.fill(bucket_data(b), 0.0f, buckets_[b].end - buckets_[b].begin);
    opened_[b] = 1;
  }
  return bucket_data(b) + (offset - buckets_[b].begin);
}

double Reducer::retire(std::size_t i) {
  if (retired_[i]) return 0.0;
  while (launched_ <= i) {
    if (pending_[launched_] != 0)
      throw std::logic_error(fmt::format("Reducer: bucket {} retired before it is full", i));
    launch(launched_);
  }
  const double blocked = wait_for(std::move(work_[i]), "reduce-scatter", i);
  if (const ShardRange mine = shard(i); mine.size() > 0)
    device_.copy(shards_.data() + shard_at_[i], bucket_data(i) + (mine.begin - buckets_[i].begin),
                 mine.size() * sizeof(float));
  retired_[i] = 1;
  return blocked;
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
  float* data = bucket_data(i);
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
  if (mine.size() > 0) device.sum_squares_grains(shard_gradients(i), mine.size(), kZeroGrain,
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
  if (!grads_) return retire(i);  // ZeRO-2: its buffer may have been retired during backward
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
