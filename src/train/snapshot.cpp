// In-memory snapshots; Note [Snapshots] in snapshot.hpp.
#include "train/snapshot.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace lockstep::detail {

std::size_t SnapshotSlot::part_floats(const std::vector<SnapshotRange>& ranges,
                                      std::size_t vectors) {
  const std::size_t elements = std::accumulate(
      ranges.begin(), ranges.end(), std::size_t{0},
      [](std::size_t sum, const SnapshotRange& r) { return sum + r.size(); });
  return elements * (1 + vectors);
}

void SnapshotSlot::ensure(Part& part, std::size_t floats, const Allocate& allocate) {
  if (part.capacity >= floats && part.memory) return;
  part.memory = allocate(floats * sizeof(float));
  part.capacity = floats;
}

// Gives up what `b` held: it is to hold step `step` (-1: nothing) from workers_ parts, none
// begun; the parts' memory is kept.
void SnapshotSlot::clear(Buffer& b, std::int64_t step) const {
  b.step = step;
  b.complete = false;
  b.skeleton.reset();
  b.parts.resize(static_cast<std::size_t>(workers_));
  for (Part& p : b.parts) {
    p.begun = false;
    p.done = false;
    p.ranges.clear();
  }
}

void SnapshotSlot::start_group(int workers) {
  std::lock_guard lock(mutex_);
  workers_ = workers;
  for (int i = 0; i < 2; ++i)
    if (i != newest_) clear(buffers_[i], -1);
}

void SnapshotSlot::reserve(int rank, std::size_t floats, const Allocate& allocate) {
  std::lock_guard lock(mutex_);
  for (int i = 0; i < 2; ++i)
    if (i != newest_) ensure(buffers_[i].parts.at(static_cast<std::size_t>(rank)), floats, allocate);
}

float* SnapshotSlot::begin_part(int rank, std::int64_t step, std::vector<SnapshotRange> ranges,
                                std::size_t vectors, const Allocate& allocate,
                                std::optional<Checkpoint> skeleton) {
  std::lock_guard lock(mutex_);
  Buffer& b = writing();
  if (b.step != step) clear(b, step);  // the first worker here: the old contents are given up
  Part& part = b.parts.at(static_cast<std::size_t>(rank));
  ensure(part, part_floats(ranges, vectors), allocate);
  part.ranges = std::move(ranges);
  part.begun = true;
  if (skeleton) b.skeleton = std::move(skeleton);
  return reinterpret_cast<float*>(part.memory.get());
}

void SnapshotSlot::part_done(int rank, std::int64_t step) {
  std::lock_guard lock(mutex_);
  Buffer& b = writing();
  if (b.step != step || b.complete) return;  // given up for a newer one, or a failed group's
  b.parts.at(static_cast<std::size_t>(rank)).done = true;
  const bool all = std::all_of(b.parts.begin(), b.parts.end(),
                               [](const Part& p) { return p.begun && p.done; });
  if (!all || !b.skeleton) return;
  b.complete = true;
  newest_ = static_cast<int>(&b - buffers_.data());
}

std::optional<Checkpoint> SnapshotSlot::newest() const {
  std::lock_guard lock(mutex_);
  if (newest_ < 0) return std::nullopt;
  const Buffer& b = buffers_[newest_];
  Checkpoint ckpt = *b.skeleton;
  std::size_t n = 0;
  for (const Part& p : b.parts)
    for (const SnapshotRange& r : p.ranges) n = std::max(n, r.end);
  ckpt.params.assign(n, 0.0f);
  for (StateVector& v : ckpt.optimizer_state) v.values.assign(n, 0.0f);
  for (const Part& p : b.parts) {
    const float* memory = reinterpret_cast<const float*>(p.memory.get());
    const std::size_t elements = part_floats(p.ranges, 0);
    std::size_t at = 0;
    for (const SnapshotRange& r : p.ranges) {
      const auto out = static_cast<std::ptrdiff_t>(r.begin);
      std::copy_n(memory + at, r.size(), ckpt.params.begin() + out);
      for (std::size_t k = 0; k < ckpt.optimizer_state.size(); ++k)
        std::copy_n(memory + (1 + k) * elements + at, r.size(),
                    ckpt.optimizer_state[k].values.begin() + out);
      at += r.size();
    }
  }
  return ckpt;
}

}  // namespace lockstep::detail
