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
// of an element does not depend on how the buffer was cut into calls (buckets) nor into slices.
// reduce_scatter is phases 1-2 (the slices are its shards), all_gather is 1 and 3: an element's
// sum is the same rank-order sum either way.
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

void Communicator::attach(Device& device) {
  bind(device.queue());
  device.set_abort_check([this] { return aborted(); });  // Note [Abortable waits]
}

std::unique_ptr<CommWork> Communicator::start(std::function<void()> collective) {
  struct Done final : CommWork {
    void wait() override {}
  };
  collective();
  return std::make_unique<Done>();
}

std::unique_ptr<CommWork> Communicator::all_reduce_async(float* data, std::size_t count,
                                                         ReduceOp op) {
  return start([=, this] { all_reduce(data, count, op); });
}

std::unique_ptr<CommWork> Communicator::reduce_scatter_async(float* data, std::size_t count,
                                                             std::size_t grain, ReduceOp op) {
  return start([=, this] { reduce_scatter(data, count, grain, op); });
}

std::unique_ptr<CommWork> Communicator::all_gather_async(float* data, std::size_t count,
                                                         std::size_t grain) {
  return start([=, this] { all_gather(data, count, grain); });
}

namespace {

using detail::CommThread;

// Interconnect emulation for benchmarks: seconds = alpha + passes (n-1)/n * bytes / bandwidth,
// where an all-reduce makes 2 passes over the buffer and a reduce-scatter or all-gather 1.
struct Wire {
  double alpha_s = 0.0;
  double bytes_per_s = 0.0;  // 0: no emulation
  double delay(std::size_t bytes, int ranks, double passes) const {
    if (bytes_per_s <= 0.0) return 0.0;
    return alpha_s + passes * (ranks - 1) / ranks * static_cast<double>(bytes) / bytes_per_s;
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

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size; }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    Group& g = *group_;
    if (g.size == 1) return check_not_aborted();  // sum and average of one rank: the identity
    publish(data);
    reduce_slice(shard_range(count, g.size, rank_), op);
    sync(g.data);
    copy_other_slices(data, count, 1);
    emulate_wire(count, 2.0);
    sync(g.data);
  }

  void reduce_scatter(float* data, std::size_t count, std::size_t grain, ReduceOp op) override {
    Group& g = *group_;
    if (g.size == 1) return check_not_aborted();
    publish(data);
    reduce_slice(shard_range(count, g.size, rank_, grain), op);
    emulate_wire(count, 1.0);
    sync(g.data);  // every rank has read our buffer
  }

  void all_gather(float* data, std::size_t count, std::size_t grain) override {
    Group& g = *group_;
    if (g.size == 1) return check_not_aborted();
    publish(data);
    copy_other_slices(data, count, grain);
    emulate_wire(count, 1.0);
    sync(g.data);
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

 protected:
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    return thread_.submit(std::move(collective));
  }

 private:
  void check_not_aborted() const {
    if (aborted()) throw CommAborted();
  }
  void sync(detail::AbortableBarrier& b) { b.arrive_and_wait(rank_); }

  // Phase 1: every rank's buffer becomes readable by every other.
  void publish(float* data) {
    group_->slots[rank_] = data;
    sync(group_->data);
  }
  // Phase 3: our copy of every other rank's shard, from that rank's buffer.
  void copy_other_slices(float* data, std::size_t count, std::size_t grain) {
    const Group& g = *group_;
    for (int r = 0; r < g.size; ++r) {
      const ShardRange o = shard_range(count, g.size, r, grain);
      if (r != rank_ && o.size() > 0)
        std::memcpy(data + o.begin, g.slots[r] + o.begin, o.size() * sizeof(float));
    }
  }
  // LOCKSTEP_EMULATE_INTERCONNECT (see Wire).
  void emulate_wire(std::size_t count, double passes) const {
    const Group& g = *group_;
    if (const double delay = g.wire.delay(count * sizeof(float), g.size, passes); delay > 0.0)
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }

  // data[s] = (slots[0][s] + slots[1][s] + ...) in rank order, a cache-sized chunk at a time so
  // the inner loops vectorise. Our own slice of `data` is read only by us during this phase.
  void reduce_slice(ShardRange s, ReduceOp op) {
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
  CommThread thread_;
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
