// The data plane's all-reduce across processes that share one node: through a window of shared
// memory instead of messages, on the caller's own thread.
//
// Note [Shared-memory all-reduce]
//   When every process of the job runs on one node (MPI_Comm_split_type MPI_COMM_TYPE_SHARED
//   finds them all), the MPI thread allocates one window of shared memory at start-up
//   (MPI_Win_allocate_shared, the only MPI calls: Note [One MPI thread] holds) with a slot of
//   kRound floats per process, twice (rounds alternate between the two), and a header of
//   atomics. A buffer goes through in rounds of at most kRound floats, each cut into one slice
//   per process (shard_range). In a round process p
//     1. copies the slices of the other processes from its buffer into its slot;   publish
//     2. sums slice p over the processes in rank order (its own part from its buffer, the
//        others' from their slots), with the fused all-reduce's loop (rank_order_sum.hpp),
//        into its buffer and into slice p of its slot;                             publish
//     3. copies every other slice q, summed, from q's slot into its buffer.         publish
//   Each process waits for the others' publication before the next step; before it writes a
//   slot again, two rounds later, every process has published step 3 of the round that used it.
//   So each element is summed once, by one process, in rank order ((a0 + a1) + a2 ...: the
//   fused all-reduce's order), and copied to the others: every process ends with the same bits,
//   whatever the round and slice boundaries. With two processes that is a + b, the bits of the
//   ring; with three or more the ring's order differs (it starts each segment's sum at another
//   process), so the last bits can differ from a run over messages (between nodes), as they
//   already differ between 2 x 2 and 1 x 4 workers (Note [Hierarchical all-reduce]).
//   Per process this copies a slice out and the others' sums in, besides the sum itself, where
//   the ring staged every chunk it sent and received on top of what MPI itself copied; and it
//   runs on the thread that calls all_reduce, so the hand-off to the MPI thread and back goes
//   too. On one node it measured 1.6-2.7x the ring at every size from 4 KB to 16 MB, and at
//   4 MB 1.2-1.7x the idle figure of Open MPI's blocking MPI_Allreduce (bench/RESULTS.md), so
//   every size goes through it.
//
//   Waiting: a publication stores the round's number into the process's counter and bumps a
//   shared wake word; a waiter polls briefly (pause, then yield) and then sleeps on the wake
//   word with a futex that is not private (FUTEX_WAIT on the shared mapping: std::atomic::wait
//   uses private futexes, which never wake across processes). A publisher makes the futex call
//   only when someone sleeps.
//   Aborting: abort() stores who aborted into the header's abort word and wakes everyone; every
//   wait checks the word, so both the aborted process and its peers leave their collective with
//   CommAborted at once, without spinning on (MpiProcesses then aborts the peer's whole group,
//   Note [One MPI thread]). No other process ever writes into a caller's buffer, only into its
//   own slot, so a caller that leaves may free its buffer at once.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lockstep::detail {

class SharedWindowAllReduce {
 public:
  // Floats per slot: 1 MiB. 2^16-2^18 measured alike at 1-16 MB, 2^20 and 2^22 slower from 4 MB.
  static constexpr std::size_t kRound = std::size_t{1} << 18;

  // On the MPI thread, collective over `world` (blocking, at start-up): the window when every
  // process of `world` shares this node, else null (then the ring serves, Note [Ring
  // all-reduce]); null too when LOCKSTEP_MPI_SHARED_MEMORY=0 in any process.
  static std::unique_ptr<SharedWindowAllReduce> create(MPI_Comm world);
  ~SharedWindowAllReduce();
  SharedWindowAllReduce(const SharedWindowAllReduce&) = delete;
  SharedWindowAllReduce& operator=(const SharedWindowAllReduce&) = delete;

  // On the MPI thread, at a clean shutdown, in every process: frees the window (collective).
  void free_window() noexcept;

  // data[i] = sum over the processes of data[i], the same bits in every process. Called by one
  // thread at a time, by every process in the same order. Throws CommAborted once any process
  // has aborted.
  void all_reduce(float* data, std::size_t count);

  // From any thread: every wait of every process's all_reduce ends with CommAborted, now and
  // later. Never blocks.
  void abort() noexcept;
  bool aborted() const noexcept;
  // Another process aborted first.
  bool aborted_by_peer() const noexcept;

 private:
  struct Header;
  struct Counter;
  // The steps of a round (Note [Shared-memory all-reduce]): each process has a counter per
  // step, the number of the last round in which it finished that step.
  enum Step { copied, summed, gathered, kSteps };
  SharedWindowAllReduce(MPI_Comm node, MPI_Win window, void* base, int rank, int size);

  void round(float* data, std::size_t n);
  float* slot(int process, std::uint64_t round) const;
  Counter& counter(Step step, int process) const;
  void publish(Step step, std::uint64_t round) const;
  // Waits until every other process has finished `step` of `round`.
  void wait_for_all(Step step, std::uint64_t round) const;
  void wait_for(const Counter& counter, std::uint64_t round) const;
  void sleep_unless(const Counter& counter, std::uint64_t round) const;
  void wake() const noexcept;

  MPI_Comm node_;
  MPI_Win window_;
  Header* header_;
  Counter* counters_;  // [step][process]
  float* slots_;       // [process][round % 2][kRound]
  int rank_, size_;
  std::uint64_t rounds_ = 0;  // rounds so far, the same count in every process
  std::vector<float*> in_;    // one per process, reused
};

}  // namespace lockstep::detail
