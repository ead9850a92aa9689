// The CPU backend's communicator: every rank is a thread of this process, and every rank's
// buffer is reachable from every other rank.
//
// All-reduce, reduce-scatter then all-gather over shared memory:
//   1. each rank publishes its buffer pointer;                      barrier
//   2. rank r sums slice r over ranks 0..N-1 (always in that order, so the result is
//      deterministic) and writes it into slice r of its own buffer;  barrier
//   3. rank r copies every other slice s from rank s's buffer;        barrier
// The last barrier keeps a rank from reusing its buffer while others still read from it.
// Each slice is computed once and copied, so every rank ends with the same bits, and the result
// of an element does not depend on how the buffer was cut into calls (buckets).
//
// Two planes, two barriers. The data plane (all_reduce, broadcast) may run on a rank's
// communication thread (all_reduce_async) while its worker thread uses the control plane
// (barrier, host collectives): each plane is one sequence of phases that every rank walks in
// the same order. abort() aborts both barriers and ends every wait in the group.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/abortable_barrier.hpp"
#include "comm/comm_thread.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"

namespace lockstep {

void Communicator::attach(const Device& device) { bind(device.queue()); }

std::unique_ptr<CommWork> Communicator::all_reduce_async(float* data, std::size_t count,
                                                         ReduceOp op) {
  struct Done final : CommWork {
    void wait() override {}
  };
  all_reduce(data, count, op);
  return std::make_unique<Done>();
}

namespace {

using detail::CommThread;

// Interconnect emulation for benchmarks: seconds = alpha + 2(n-1)/n * bytes / bandwidth.
struct Wire {
  double alpha_s = 0.0;
  double bytes_per_s = 0.0;  // 0: no emulation
  double delay(std::size_t bytes, int ranks) const {
    if (bytes_per_s <= 0.0) return 0.0;
    return alpha_s + 2.0 * (ranks - 1) / ranks * static_cast<double>(bytes) / bytes_per_s;
  }
};

Wire wire_from_environment() {
  const char* spec = std::getenv("LOCKSTEP_EMULATE_INTERCONNECT");
  if (!spec || !*spec) return {};
  double alpha_us = 0.0, gbps = 0.0;
  if (std::sscanf(spec, "%lf,%lf", &alpha_us, &gbps) != 2 || alpha_us < 0 || gbps <= 0)
    throw InputError(std::string("LOCKSTEP_EMULATE_INTERCONNECT: expected ALPHA_US,GBPS, got '") +
                     spec + "'");
  return {alpha_us * 1e-6, gbps * 1e9};
}

struct Group {
  explicit Group(int n)
      : size(n), data(n), control(n), slots(n), host_slots(n), wire(wire_from_environment()) {}

  const int size;
  detail::AbortableBarrier data;     // data plane
  detail::AbortableBarrier control;  // control plane
  std::vector<float*> slots;             // data-plane buffers, one per rank
  std::vector<const void*> host_slots;   // control-plane buffers
  Wire wire;
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
    sync(g.data);
    reduce_slice(slice_of(count, g.size, rank_), op);
    sync(g.data);
    for (int r = 0; r < g.size; ++r) {
      if (r == rank_) continue;
      const Slice o = slice_of(count, g.size, r);
      if (o.end > o.begin)
        std::memcpy(data + o.begin, g.slots[r] + o.begin, (o.end - o.begin) * sizeof(float));
    }
    if (const double delay = g.wire.delay(count * sizeof(float), g.size); delay > 0.0)
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    sync(g.data);
  }

  std::unique_ptr<CommWork> all_reduce_async(float* data, std::size_t count,
                                             ReduceOp op) override {
    return thread_.submit(data, count, op);
  }

  void broadcast(float* data, std::size_t count, int root) override {
    Group& g = *group_;
    if (root < 0 || root >= g.size) throw std::invalid_argument("broadcast: root out of range");
    if (g.size == 1) return check_not_aborted();
    g.slots[rank_] = data;
    sync(g.data);
    if (rank_ != root && count) std::memcpy(data, g.slots[root], count * sizeof(float));
    sync(g.data);
  }

  void barrier() override { sync(group_->control); }

  void all_reduce_host(std::span<double> values) override {
    Group& g = *group_;
    std::vector<double> mine(values.begin(), values.end());
    g.host_slots[rank_] = mine.data();
    sync(g.control);
    for (std::size_t i = 0; i < values.size(); ++i) {
      double acc = 0.0;
      for (int r = 0; r < g.size; ++r) acc += static_cast<const double*>(g.host_slots[r])[i];
      values[i] = acc;
    }
    sync(g.control);
  }

  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override {
    Group& g = *group_;
    g.host_slots[rank_] = &value;
    sync(g.control);
    std::vector<std::uint64_t> all(g.size);
    for (int r = 0; r < g.size; ++r) all[r] = *static_cast<const std::uint64_t*>(g.host_slots[r]);
    sync(g.control);
    return all;
  }

  void abort() noexcept override {
    group_->data.abort();
    group_->control.abort();
  }

  bool aborted() const noexcept override { return group_->control.aborted(); }

 private:
  void check_not_aborted() const {
    if (aborted()) throw CommAborted();
  }
  void sync(detail::AbortableBarrier& b) { b.arrive_and_wait(rank_); }

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
  std::vector<float> scratch_;  // used by whichever thread runs the data plane, one at a time
  CommThread thread_{[this](float* data, std::size_t count, ReduceOp op) {
    all_reduce(data, count, op);
  }};
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
