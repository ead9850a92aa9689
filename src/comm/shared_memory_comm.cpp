// The CPU backend's communicator: every rank is a thread of this process, and every rank's
// buffer is reachable from every other rank.
//
// Note [Fused all-reduce]
//   All-reduce over shared memory, in two phases:
//     1. each rank publishes its buffer pointer;                                  barrier
//     2. rank r sums slice r over ranks 0..N-1 (always in that order, so the result is
//        deterministic) and writes the sum into slice r of *every* rank's buffer;  barrier
//   The last barrier keeps a rank from reusing its buffer while others still write into it.
//   Slice r of any buffer is read and written by rank r alone during phase 2, a chunk at a time:
//   the chunk's inputs are all read (into a small accumulator that stays in L1) before its
//   outputs are written, so writing into a peer's buffer never overwrites an input still needed.
//   Each element is computed once and stored N times, so every rank ends with the same bits, and
//   the result of an element does not depend on how the buffer was cut into calls (buckets) nor
//   into slices. Per rank this moves about 2 S bytes for a buffer of S (N reads, N writes of a
//   1/N slice), where a reduce-scatter followed by an all-gather pass moved S(3N-1)/N and met in
//   three barriers: bench/RESULTS.md measured +29-84% at 64-256 MB. Non-temporal stores of the
//   sums measured slower on the CPU of bench/RESULTS.md (the peers read the lines soon after).
//   reduce_scatter is phase 2 writing into the rank's own buffer only (its shard), all_gather is
//   phase 1 and a copy of every other rank's shard: an element's sum is the same rank-order sum
//   either way.
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
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "comm/abortable_barrier.hpp"
#include "comm/comm_thread.hpp"
#include "comm/rank_order_sum.hpp"
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

// The element loop of the fused all-reduce: for each element i of `slice`, the sum over ranks
// of in[r][i] in rank order, divided by `divisor` when not 1 (an average), stored into out[q][i]
// for every q. Element is the type of the buffers; sums are taken in float, so a narrower type
// (bf16) only needs its conversions to and from float. A chunk at a time: the loops over one
// chunk vectorise, and the accumulator stays in L1 between the reads and the stores.
template <class Element>
[[gnu::always_inline]] inline void sum_in_rank_order(std::span<Element* const> in,
                                                     std::span<Element* const> out,
                                                     ShardRange slice, int divisor) {
  constexpr std::size_t kChunk = 4096;  // 16 KiB of float sums
  float acc[kChunk];
  const float inv = 1.0f / static_cast<float>(divisor);
  for (std::size_t begin = slice.begin; begin < slice.end; begin += kChunk) {
    const std::size_t n = std::min(kChunk, slice.end - begin);
    const Element* a = in[0] + begin;
    const Element* b = in[1] + begin;  // every group that reduces has two ranks or more
    for (std::size_t i = 0; i < n; ++i)
      acc[i] = static_cast<float>(a[i]) + static_cast<float>(b[i]);
    for (std::size_t r = 2; r < in.size(); ++r) {
      const Element* src = in[r] + begin;
      for (std::size_t i = 0; i < n; ++i) acc[i] += static_cast<float>(src[i]);
    }
    if (divisor != 1)
      for (std::size_t i = 0; i < n; ++i) acc[i] *= inv;
    for (Element* dst : out) {
      if constexpr (std::is_same_v<Element, float>) {
        std::memcpy(dst + begin, acc, n * sizeof(float));
      } else {
        for (std::size_t i = 0; i < n; ++i) dst[begin + i] = static_cast<Element>(acc[i]);
      }
    }
  }
}

}  // namespace

namespace detail {

// Note [Wide vectors for the sums]
//   The library is compiled for baseline x86-64, so the loops above get SSE2's 4-float vectors.
//   Compiled for AVX2 as well and chosen at run time, they measured 10-15% more busbw at 16-256
//   MB on the CPU of bench/RESULTS.md (AVX-512 no more than AVX2), where the copy beside them
//   (memcpy) already uses the widest vectors. The same additions in the same order for every
//   element, and no FMA (the target adds none), so the same bits either way.
#if defined(__x86_64__)
[[gnu::target("avx2")]] void sum_floats_avx2(std::span<float* const> in,
                                             std::span<float* const> out, ShardRange slice,
                                             int divisor) {
  sum_in_rank_order<float>(in, out, slice, divisor);
}
#endif

void sum_floats(std::span<float* const> in, std::span<float* const> out, ShardRange slice,
                int divisor) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return sum_floats_avx2(in, out, slice, divisor);
#endif
  sum_in_rank_order<float>(in, out, slice, divisor);
}

}  // namespace detail

namespace {

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
  std::string describe() const override {
    return fmt::format("shared memory: {} worker{} of one process", size(),
                       size() == 1 ? "" : "s");
  }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    Group& g = *group_;
    if (g.size == 1) return check_not_aborted();  // sum and average of one rank: the identity
    publish(data);
    reduce_slice(shard_range(count, g.size, rank_), op, g.slots);
    emulate_wire(count, 2.0);
    sync(g.data);  // every rank's slices are in our buffer, and nobody reads it any more
  }

  void reduce_scatter(float* data, std::size_t count, std::size_t grain, ReduceOp op) override {
    Group& g = *group_;
    if (g.size == 1) return check_not_aborted();
    publish(data);
    reduce_slice(shard_range(count, g.size, rank_, grain), op, {&g.slots[rank_], 1});
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
    check_not_aborted();  // Note [Write after an abort]
    g.slots[rank_] = data;
    sync(g.data);
    if (rank_ != root && count) std::memcpy(data, g.slots[root], count * sizeof(float));
    sync(g.data);
  }

  void barrier() override { sync(group_->control); }

  void all_reduce_host(std::span<double> values) override {
    Group& g = *group_;
    std::vector<double> mine(values.begin(), values.end());
    check_not_aborted();  // Note [Write after an abort]
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
    check_not_aborted();  // Note [Write after an abort]
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

  // Either plane's: abort() marks the data plane first, and a rank released by it must see it
  // (Note [Write after an abort]).
  bool aborted() const noexcept override {
    return group_->data.aborted() || group_->control.aborted();
  }

 protected:
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    return thread_.submit(std::move(collective));
  }

 private:
  // Note [Write after an abort]
  //   An abort releases every rank from its barrier at once, so a rank may leave a collective
  //   while a peer still reads the slots of it (that peer was summing, not waiting). The rank's
  //   next collective (its communication thread may have one queued) must then not write its
  //   slot under that read: every collective checks the abort before it writes one. The rank
  //   that left saw the abort itself, so the check cannot miss it.
  void check_not_aborted() const {
    if (aborted()) throw CommAborted();
  }
  static void sync(detail::AbortableBarrier& b) { b.arrive_and_wait(); }

  // Phase 1: every rank's buffer becomes readable by every other. Note [Write after an abort].
  void publish(float* data) {
    check_not_aborted();
    group_->slots[rank_] = data;
    sync(group_->data);
  }
  // all_gather: our copy of every other rank's shard, from that rank's buffer.
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

  // Phase 2 (Note [Fused all-reduce]): out[q][s] = (slots[0][s] + slots[1][s] + ...) for every
  // buffer q of `out`.
  void reduce_slice(ShardRange s, ReduceOp op, std::span<float* const> out) const {
    const Group& g = *group_;
    detail::sum_floats(g.slots, out, s, op == ReduceOp::avg ? g.size : 1);
  }

  std::shared_ptr<Group> group_;
  int rank_;
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
