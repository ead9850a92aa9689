// The data plane's all-reduce across processes on several nodes (on one node the shared-memory
// window serves, Note [Shared-memory all-reduce]): a ring of MPI point-to-point calls over the
// caller's buffer, advanced without blocking by the MPI thread (Note [One MPI thread]).
//
// Note [Ring all-reduce]
//   P processes, the buffer cut into P segments (shard_range). Reduce-scatter: in step t
//   (0 <= t < P-1) process p sends segment p-t to its right neighbour and adds segment p-t-1,
//   received from its left, into its own buffer (own + received); after P-1 steps process p holds
//   the full sum of segment p+1. All-gather: in step u (0 <= u < P-1) it sends segment p+1-u and
//   copies the received segment p-u into its buffer. Every segment is summed by one process and
//   copied to the others, so every process ends with the same bits; the order of a segment's sum
//   is fixed by P alone (with two processes it is a + b, the same bits in either order, as MPI's
//   own reduction). Each process sends and receives 2(P-1)/P of the buffer, the least an
//   all-reduce can. The pipelined MPI_Iallreduce it replaces reached 34-48% of the blocking
//   MPI_Allreduce's busbw at 4-64 MB; the ring 65% at 4 MB and more than the blocking call from
//   16 MB (bench/RESULTS.md).
//   Every step is cut into chunks of kChunk floats (64 Ki measured best of 32-256 Ki), with up
//   to kSlots receives and kSlots sends in flight, so the steps overlap: a chunk received and
//   summed is sent on at once. Messages go in the same order on every process (step, then
//   chunk) with one tag, and MPI keeps the order between two processes on one communicator, so
//   each receive meets its send.
//   MPI never touches the caller's buffer: receives land in staging chunks owned by the ring,
//   and sends go out of staging too (a copy of one chunk, still in cache; sending straight from
//   the caller's buffer measured slower, besides). Only the MPI thread touches the caller's
//   buffer, between MPI calls and under a lock; the caller, aborted, abandon()s the ring, after
//   which nobody touches the buffer again, while calls still pending in MPI use staging that the
//   ring keeps alive. So an abort completes at once and the caller may free its buffer (Note
//   [One MPI thread]).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace lockstep::detail {

class RingAllReduce {
 public:
  static constexpr std::size_t kChunk = std::size_t{1} << 16;  // floats: 256 KiB
  static constexpr int kSlots = 4;                              // receives (and sends) in flight
  // 2 kSlots chunks of kChunk floats, reused from one call to the next.
  using Staging = std::vector<float>;

  // data[i] = sum over the processes of comm of data[i]. Nothing happens before advance().
  RingAllReduce(float* data, std::size_t count, MPI_Comm comm, int rank, int size);

  // On the MPI thread: posts what may be posted, tests what is in flight, sums or copies what
  // arrived. `staging` is used from the first call on (a fresh one when null). Returns an MPI
  // error code; sets `progressed` when anything completed.
  int advance(std::shared_ptr<Staging>& staging, bool& progressed);
  // Every call of the ring has completed: data holds the sum.
  bool finished() const noexcept {
    return recvs_done_ == recvs_.size() && sends_done_ == sends_.size();
  }
  // The staging, for the next ring once this one has finished cleanly.
  std::shared_ptr<Staging> release_staging() noexcept { return std::move(staging_); }

  // On the caller's thread, when it gives up: once this returns, the ring never touches data
  // again. Never blocks on MPI.
  void abandon() noexcept;

 private:
  struct Unit {
    std::size_t offset = 0;  // elements of data
    int n = 0;
    bool add = false;      // a receive of the reduce-scatter (else a copy)
    std::ptrdiff_t after = -1;  // a send: the receive whose result it forwards, or -1
  };
  void plan(std::size_t count, int rank, int size);
  int post();
  void complete(int slot);
  float* stage(int slot) { return staging_->data() + static_cast<std::size_t>(slot) * kChunk; }

  float* data_;
  MPI_Comm comm_;
  int left_ = 0, right_ = 0;
  std::vector<Unit> recvs_, sends_;  // in posting order
  std::vector<char> received_;       // per receive: summed or copied into data
  std::size_t next_recv_ = 0, next_send_ = 0, recvs_done_ = 0, sends_done_ = 0;
  // [0, kSlots): receives, [kSlots, 2 kSlots): sends; the unit each slot holds, or -1.
  MPI_Request requests_[2 * kSlots];
  std::ptrdiff_t slot_unit_[2 * kSlots];
  std::shared_ptr<Staging> staging_;

  std::mutex user_;  // held while the MPI thread touches data_
  bool abandoned_ = false;
};

}  // namespace lockstep::detail
