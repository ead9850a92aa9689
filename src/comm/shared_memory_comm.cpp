// The CPU backend's communicator: every rank is a thread of this process, and every rank's
// buffer is reachable from every other rank.
//
// All-reduce, reduce-scatter then all-gather over shared memory:
//   1. each rank publishes its buffer pointer;                      barrier
//   2. rank r sums slice r over ranks 0..N-1 (always in that order, so the result is
//      deterministic) and writes it into slice r of its own buffer;  barrier
//   3. rank r copies every other slice s from rank s's buffer;        barrier
// The last barrier keeps a rank from reusing its buffer while others still read from it.
// Each slice is computed once and copied, so every rank ends with the same bits.
//
// The whole group shares ONE std::barrier, so its phases form a single sequence that every rank
// walks in the same order. A failing rank sets the abort flag and then drops out of the barrier
// (arrive_and_drop): the phase the others wait in completes without it, they see the flag and
// throw CommAborted. The flag is set before the drop, so any phase the drop completes sees it.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep {
namespace {

struct Group {
  explicit Group(int n) : size(n), barrier(n), slots(n), host_slots(n), dropped(n) {}

  const int size;
  std::barrier<> barrier;
  std::atomic<bool> aborted{false};
  std::vector<float*> slots;               // data-plane buffers, one per rank
  std::vector<const void*> host_slots;     // control-plane buffers
  std::vector<std::atomic<bool>> dropped;  // rank has left the barrier for good
};

// Slice [begin, end) of `count` elements owned by `rank`: the remainder goes to the first ranks,
// so any count (0, < size, not divisible) is covered exactly once.
struct Slice {
  std::size_t begin, end;
};
Slice slice_of(std::size_t count, int size, int rank) {
  const std::size_t base = count / size, extra = count % size;
  const std::size_t r = static_cast<std::size_t>(rank);
  const std::size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size; }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    Group& g = *group_;
    if (g.size == 1) {
      check_not_aborted();
      return;  // sum and average of one rank are the identity
    }
    g.slots[rank_] = data;
    sync();
    const Slice s = slice_of(count, g.size, rank_);
    reduce_slice(s, op);
    sync();
    for (int r = 0; r < g.size; ++r) {
      if (r == rank_) continue;
      const Slice o = slice_of(count, g.size, r);
      if (o.end > o.begin)
        std::memcpy(data + o.begin, g.slots[r] + o.begin, (o.end - o.begin) * sizeof(float));
    }
    sync();
  }

  void broadcast(float* data, std::size_t count, int root) override {
    Group& g = *group_;
    if (root < 0 || root >= g.size) throw std::invalid_argument("broadcast: root out of range");
    if (g.size == 1) return check_not_aborted();
    g.slots[rank_] = data;
    sync();
    if (rank_ != root && count) std::memcpy(data, g.slots[root], count * sizeof(float));
    sync();
  }

  void barrier() override { sync(); }

  void all_reduce_host(std::span<double> values) override {
    Group& g = *group_;
    std::vector<double> mine(values.begin(), values.end());
    g.host_slots[rank_] = mine.data();
    sync();
    for (std::size_t i = 0; i < values.size(); ++i) {
      double acc = 0.0;
      for (int r = 0; r < g.size; ++r) acc += static_cast<const double*>(g.host_slots[r])[i];
      values[i] = acc;
    }
    sync();
  }

  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override {
    Group& g = *group_;
    g.host_slots[rank_] = &value;
    sync();
    std::vector<std::uint64_t> all(g.size);
    for (int r = 0; r < g.size; ++r) all[r] = *static_cast<const std::uint64_t*>(g.host_slots[r]);
    sync();
    return all;
  }

  void abort() noexcept override {
    Group& g = *group_;
    g.aborted.store(true);
    if (!g.dropped[rank_].exchange(true)) g.barrier.arrive_and_drop();
  }

  bool aborted() const noexcept override { return group_->aborted.load(); }

 private:
  void check_not_aborted() const {
    if (group_->aborted.load()) throw CommAborted();
  }
  // One phase of the group's barrier, then the abort check.
  void sync() {
    check_not_aborted();
    group_->barrier.arrive_and_wait();
    check_not_aborted();
  }

  // data[s] = (slots[0][s] + slots[1][s] + ...) in rank order, a cache-sized chunk at a time so
  // the inner loops vectorise. Our own slice of `data` is read only by us during this phase.
  void reduce_slice(Slice s, ReduceOp op) {
    constexpr std::size_t kChunk = 4096;
    const Group& g = *group_;
    const float inv = 1.0f / static_cast<float>(g.size);
    scratch_.resize(kChunk);
    float* acc = scratch_.data();
    float* out = g.slots[rank_];
    for (std::size_t begin = s.begin; begin < s.end; begin += kChunk) {
      const std::size_t n = std::min(kChunk, s.end - begin);
      std::memcpy(acc, g.slots[0] + begin, n * sizeof(float));
      for (int r = 1; r < g.size; ++r) {
        const float* src = g.slots[r] + begin;
        for (std::size_t i = 0; i < n; ++i) acc[i] += src[i];
      }
      if (op == ReduceOp::avg)
        for (std::size_t i = 0; i < n; ++i) acc[i] *= inv;
      std::memcpy(out + begin, acc, n * sizeof(float));
    }
  }

  std::shared_ptr<Group> group_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_shared_memory_group(int size) {
  if (size < 1) throw std::invalid_argument("make_shared_memory_group: size must be >= 1");
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r)
    comms.push_back(std::make_unique<SharedMemoryCommunicator>(group, r));
  return comms;
}

}  // namespace lockstep
