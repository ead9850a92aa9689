// Note [Shared-memory all-reduce] is in shared_window_all_reduce.hpp.
#include "comm/mpi/shared_window_all_reduce.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <span>

#include "comm/rank_order_sum.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

struct SharedWindowAllReduce::Header {
  alignas(64) std::atomic<std::uint32_t> wake{0};      // bumped at every publication: the futex
  std::atomic<std::uint32_t> sleepers{0};              // processes asleep (or about to be) on it
  alignas(64) std::atomic<std::uint32_t> aborted_by{0};  // 1 + rank of the first to abort, or 0
};

struct SharedWindowAllReduce::Counter {
  alignas(64) std::atomic<std::uint64_t> round{0};  // a cache line each: only its owner writes
};

namespace {

static_assert(std::atomic<std::uint32_t>::is_always_lock_free &&
              std::atomic<std::uint64_t>::is_always_lock_free &&
              sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

// How long a waiter polls before it sleeps: kPolls with a pause (some microseconds: a peer on
// another core is usually that close), then kYields giving the core to a runnable thread.
// Sleeping at once measured 1.6x slower at 4 MB, 10x the polls no faster (bench/RESULTS.md).
constexpr int kPolls = 2000, kYields = 50;

constexpr std::size_t kAlign = 4096;

void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// FUTEX_WAIT and FUTEX_WAKE without FUTEX_PRIVATE_FLAG: the word lives in a mapping that other
// processes share. The timeout only bounds a sleep whose wake-up was lost.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen) noexcept {
  const timespec timeout{0, 100'000'000};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &timeout,
          nullptr, 0);
}
void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, 0x7fffffff, nullptr,
          nullptr, 0);
}

bool enabled_by_environment() {
  const char* v = std::getenv("LOCKSTEP_MPI_SHARED_MEMORY");
  return !(v && std::strcmp(v, "0") == 0);
}

// The window: the header, the counters, then the slots, each part aligned.
std::size_t counters_offset() { return kAlign; }
std::size_t slots_offset(int size) {
  const std::size_t counters = 3 * static_cast<std::size_t>(size) * 64;
  return counters_offset() + (counters + kAlign - 1) / kAlign * kAlign;
}
std::size_t window_bytes(int size) {
  return slots_offset(size) +
         static_cast<std::size_t>(size) * 2 * SharedWindowAllReduce::kRound * sizeof(float);
}

}  // namespace

std::unique_ptr<SharedWindowAllReduce> SharedWindowAllReduce::create(MPI_Comm world) {
  int size = 0;
  MPI_Comm_size(world, &size);
  if (size < 2) return nullptr;
  MPI_Comm node = MPI_COMM_NULL;
  int node_size = 0;
  if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS)
    MPI_Comm_size(node, &node_size);
  int usable = node_size == size && enabled_by_environment();
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, world);
  MPI_Win window = MPI_WIN_NULL;
  void* base = nullptr;
  int rank = 0;
  if (usable) {
    // Process 0 allocates it all, one piece: every process finds it at process 0's address.
    MPI_Comm_rank(node, &rank);
    const auto bytes = static_cast<MPI_Aint>(window_bytes(size) + kAlign);
    usable = MPI_Win_allocate_shared(rank == 0 ? bytes : 0, 1, MPI_INFO_NULL, node, &base,
                                     &window) == MPI_SUCCESS;
    MPI_Aint got = 0;
    int unit = 0;
    usable = usable && MPI_Win_shared_query(window, 0, &got, &unit, &base) == MPI_SUCCESS &&
             got >= bytes;
    MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, node);
  }
  if (!usable) {
    if (window != MPI_WIN_NULL) MPI_Win_free(&window);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    return nullptr;
  }
  base = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(base) + kAlign - 1) /
                                 kAlign * kAlign);
  auto* bytes = static_cast<unsigned char*>(base);
  if (rank == 0) {
    new (bytes) Header;
    for (int i = 0; i < 3 * size; ++i) new (bytes + counters_offset() + 64 * i) Counter;
  }
  MPI_Barrier(node);  // the header is ready before anyone uses it
  return std::unique_ptr<SharedWindowAllReduce>(
      new SharedWindowAllReduce(node, window, base, rank, size));
}

SharedWindowAllReduce::SharedWindowAllReduce(MPI_Comm node, MPI_Win window, void* base,
                                             int rank, int size)
    : node_(node),
      window_(window),
      header_(static_cast<Header*>(base)),
      counters_(reinterpret_cast<Counter*>(static_cast<unsigned char*>(base) + counters_offset())),
      slots_(reinterpret_cast<float*>(static_cast<unsigned char*>(base) + slots_offset(size))),
      rank_(rank),
      size_(size),
      in_(static_cast<std::size_t>(size)) {}

SharedWindowAllReduce::~SharedWindowAllReduce() = default;

void SharedWindowAllReduce::free_window() noexcept {
  MPI_Win_free(&window_);
  MPI_Comm_free(&node_);
}

void SharedWindowAllReduce::all_reduce(float* data, std::size_t count) {
  if (aborted()) throw CommAborted();
  for (std::size_t begin = 0; begin < count; begin += kRound)
    round(data + begin, std::min(kRound, count - begin));
}

// One round of Note [Shared-memory all-reduce] over data[0, n).
void SharedWindowAllReduce::round(float* data, std::size_t n) {
  const std::uint64_t r = ++rounds_;
  float* mine = slot(rank_, r);
  if (r > 2) wait_for_all(gathered, r - 2);  // nobody reads this slot any more
  for (int q = 0; q < size_; ++q) {  // 1. the others' slices out
    const ShardRange s = shard_range(n, size_, q);
    if (q != rank_ && s.size() > 0)
      std::memcpy(mine + s.begin, data + s.begin, s.size() * sizeof(float));
  }
  publish(copied, r);
  wait_for_all(copied, r);
  for (int q = 0; q < size_; ++q)  // 2. our slice, summed in rank order
    in_[static_cast<std::size_t>(q)] = q == rank_ ? data : slot(q, r);
  float* const out[] = {data, mine};
  sum_floats(in_, out, shard_range(n, size_, rank_), 1);
  publish(summed, r);
  wait_for_all(summed, r);
  for (int q = 0; q < size_; ++q) {  // 3. the others' sums in
    const ShardRange s = shard_range(n, size_, q);
    if (q != rank_ && s.size() > 0)
      std::memcpy(data + s.begin, slot(q, r) + s.begin, s.size() * sizeof(float));
  }
  publish(gathered, r);
}

float* SharedWindowAllReduce::slot(int process, std::uint64_t round) const {
  return slots_ + (static_cast<std::size_t>(process) * 2 + round % 2) * kRound;
}

SharedWindowAllReduce::Counter& SharedWindowAllReduce::counter(Step step, int process) const {
  return counters_[static_cast<std::size_t>(step) * static_cast<std::size_t>(size_) +
                   static_cast<std::size_t>(process)];
}

// Every access below is sequentially consistent: a sleeper counts itself before its last look
// at the counter, a publisher stores the counter before it looks for sleepers, so one of them
// sees the other.
void SharedWindowAllReduce::publish(Step step, std::uint64_t round) const {
  counter(step, rank_).round.store(round);
  wake();
}

void SharedWindowAllReduce::wake() const noexcept {
  header_->wake.fetch_add(1);
  if (header_->sleepers.load() != 0) futex_wake_all(header_->wake);
}

void SharedWindowAllReduce::wait_for_all(Step step, std::uint64_t round) const {
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_for(counter(step, q), round);
}

void SharedWindowAllReduce::wait_for(const Counter& c, std::uint64_t round) const {
  for (int i = 0;; ++i) {
    if (c.round.load(std::memory_order_acquire) >= round) return;
    if (aborted()) throw CommAborted();
    if (i < kPolls) pause();
    else if (i < kPolls + kYields) sched_yield();
    else sleep_unless(c, round);
  }
}

void SharedWindowAllReduce::sleep_unless(const Counter& c, std::uint64_t round) const {
  const std::uint32_t seen = header_->wake.load();
  header_->sleepers.fetch_add(1);
  if (c.round.load() < round && !aborted()) futex_wait(header_->wake, seen);
  header_->sleepers.fetch_sub(1);
}

void SharedWindowAllReduce::abort() noexcept {
  std::uint32_t none = 0;
  header_->aborted_by.compare_exchange_strong(none, static_cast<std::uint32_t>(rank_) + 1);
  header_->wake.fetch_add(1);
  futex_wake_all(header_->wake);
}

bool SharedWindowAllReduce::aborted() const noexcept {
  return header_->aborted_by.load(std::memory_order_relaxed) != 0;
}

bool SharedWindowAllReduce::aborted_by_peer() const noexcept {
  const std::uint32_t by = header_->aborted_by.load();
  return by != 0 && by != static_cast<std::uint32_t>(rank_) + 1;
}

}  // namespace lockstep::detail
