// NCCL communicators, one per rank, non-blocking: created together from one unique id, within
// one process or across the processes of a job.
//
// Note [NCCL ordering]
//   Data-plane calls are ordered on the GPU alone, never by a host wait:
//     compute stream --ready event--> comm stream: NCCL op --done event--> compute stream
//   An async collective leaves out the last arrow until its work's wait() (Note [Stream work]
//   in stream_work.hpp), so backward runs on while buckets reduce.
//   Before enqueuing, the ranks meet at a barrier of the control group (a shared-memory group,
//   which also serves barrier() and the host collectives). It costs microseconds and is what lets
//   a failing rank stop the others: without it a rank could enqueue a collective that its failed
//   peer never joins, then block for ever in its next stream synchronisation, out of reach of
//   abort(). With it, a rank either meets every peer at the barrier, after which every peer
//   enqueues its part, or it throws CommAborted there.
//
// Note [NCCL shards]
//   reduce_scatter and all_gather take shard_range's shards. When they are all the same size
//   (count divisible by size x grain) they are NCCL's in-place ncclReduceScatter and
//   ncclAllGather (rank r's shard at data + r x count / size). Otherwise one NCCL group of
//   ncclReduce (or ncclBroadcast) calls, one per non-empty shard with its owner as root, which
//   NCCL runs as one fused operation.
//
// Note [NCCL abort]
//   One NcclComms owns the NCCL communicators of this process, one per local rank, and abort()
//   of any rank's Communicator aborts them all (ncclCommAbort), from whichever thread calls it:
//   a rank waiting on its device behind a collective whose partner died is released only when
//   its own NCCL communicator is aborted, and the failing rank is rarely that one. Every call
//   into NCCL on one communicator (an enqueue, an error poll, the destroy) runs inside that
//   communicator's AbortableSlot, so an abort from the watchdog thread never frees a
//   communicator under a worker's ncclAllReduce; and the abort never waits for the worker's
//   call to return (Note [Abort without the lock] in abortable_slot.hpp): when a worker is
//   inside, the abort is left to it, on its way out.
//
// Note [Non-blocking NCCL]
//   The communicators are made non-blocking (ncclConfig_t::blocking = 0; ncclCommInitAll takes
//   no configuration, so one process's group is made as ncclCommInitAll makes it, from one
//   ncclGetUniqueId and a group of ncclCommInitRankConfig). Then no NCCL call waits for a
//   peer: ncclGroupEnd returns ncclInProgress at once where it would have waited (connecting
//   lazily, say), and the rank polls ncclCommGetAsyncError outside the slot until the group is
//   enqueued (ncclSuccess), checking the group's abort flag between polls. A peer that never
//   arrives therefore leaves the rank polling, not blocked, and the abort ends both: the flag
//   ends the poll, the slot's abort the communicator. NCCL_COMM_BLOCKING=1 in the environment
//   overrides the configuration (NCCL reads it); every call then returns ncclSuccess and the
//   polls end at once, but a peer that never arrives can block an enqueue again.
//   Eager connection (Note [NCCL connections]) stays: it keeps the first collective's connect
//   out of the steps.
//
// Note [NCCL teardown]
//   The destructors run on the host thread after the workers have joined; each destroys its
//   rank's communicator normally, or aborts it if the group was aborted, since ncclCommDestroy
//   may wait for a peer that is gone. Before that, each worker drains its comm stream (drain()),
//   so that no collective still uses its buffers when it frees them.
//
// Note [NCCL across processes]
//   Process 0 makes the group's id (ncclGetUniqueId) and broadcasts it over the ProcessGroup
//   (MPI_Bcast); every process then creates one communicator per local GPU with
//   ncclCommInitRank, all inside one ncclGroupStart/ncclGroupEnd, since one thread initialises
//   several ranks. The control group becomes hierarchical (shared memory within the process,
//   MPI across), so the barrier before each collective (Note [NCCL ordering]) spans the job. A
//   failed process aborts its NCCL communicators locally; its peers wait at that barrier, out
//   of NCCL, until the top level ends the job (MPI_Abort).
#include "cuda/nccl_comm.hpp"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cuda/abortable_slot.hpp"
#include "cuda/bind_queue.hpp"
#include "cuda/check.hpp"
#include "cuda/handles.hpp"
#include "cuda/nvtx.hpp"
#include "cuda/stream_work.hpp"

namespace lockstep::cuda {
namespace {

// Note [NCCL connections]
//   NCCL 2.22 and later connect the ranks lazily by default (NCCL_RUNTIME_CONNECT=1): the first
//   collective of each algorithm connects inside its ncclGroupEnd and waits there for every
//   peer. A peer that never arrives (it failed after the barrier, or its device did) would then
//   leave a blocking communicator's enqueue waiting for ever, and before the communicators were
//   non-blocking (Note [Non-blocking NCCL]) the abort waited behind it. The connections are
//   still made when the communicators are made (NCCL_RUNTIME_CONNECT=0), where the ranks are all
//   present by construction (one group of ncclCommInitRankConfig, after the id's broadcast
//   across processes): the connect's seconds then fall before step 1 instead of inside it, and
//   a user who forces blocking communicators (NCCL_COMM_BLOCKING=1) keeps the guarantee. It
//   costs the buffers of algorithms the run may never use. A user who sets NCCL_RUNTIME_CONNECT
//   is obeyed. The variable is set before the first communicator is made, on the thread that
//   makes the workers, before they start (setenv is not safe against a concurrent getenv).
void connect_eagerly() {
  static std::once_flag once;
  std::call_once(once, [] { (void)setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0); });
}

// Note [Non-blocking NCCL]: a call on a non-blocking communicator may answer ncclInProgress,
// which is not an error; the caller then polls until the call's work is enqueued.
#define NCCL_START(call) \
  ::lockstep::cuda::check_started(static_cast<ncclResult_t>(call), #call, __FILE__, __LINE__)
void check_started(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclInProgress) check(status, call, file, line);
}

// ncclGroupStart() now, ncclGroupEnd() at end() or, if an enqueue threw first, on unwinding.
class NcclGroup {
 public:
  NcclGroup() { NCCL_CHECK(ncclGroupStart()); }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  void end() {
    open_ = false;
    NCCL_START(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

// Polls `state` (ncclCommGetAsyncError's answer) until the communicator's last call has done
// its work: false once `stop()` says the group aborted, true at ncclSuccess, throws on an
// error. Yields at first (an enqueue's group usually ends within microseconds), then sleeps.
// `what` names the call whose work is awaited, for the error.
template <class State, class Stop>
bool poll_until_done(const char* what, State&& state, Stop&& stop) {
  for (int polls = 0;; ++polls) {
    const ncclResult_t now = state();
    if (now == ncclSuccess) return true;
    if (now != ncclInProgress) check(now, what, __FILE__, __LINE__);
    if (stop()) return false;
    if (polls < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// The process's NCCL communicators (Note [NCCL abort]).
class NcclComms {
 public:
  explicit NcclComms(const std::vector<ncclComm_t>& comms) {
    for (ncclComm_t c : comms) slots_.push_back(std::make_unique<Slot>(c));
  }
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  // Calls f(comm) with local rank r's communicator, inside its slot. False, without calling f,
  // once the group's abort was requested or that communicator was destroyed.
  template <class F>
  bool use(int r, F&& f) {
    Slot& slot = *slots_[r];
    return slot.slot.use([&] { f(slot.comm); });
  }
  // Note [Non-blocking NCCL]: waits until rank r's last call has done its work. False when the
  // group aborted first (`aborted()`, or the slot's own abort).
  template <class Aborted>
  bool wait_done(int r, Aborted&& aborted) {
    ncclResult_t state = ncclSuccess;
    return poll_until_done(
        "an NCCL group (ncclGroupEnd, then ncclCommGetAsyncError)",
        [&] {
          if (!use(r, [&](ncclComm_t comm) { NCCL_START(ncclCommGetAsyncError(comm, &state)); }))
            return ncclInProgress;  // aborted: the stop below ends the poll
          return state;
        },
        [&] { return aborted() || slots_[r]->slot.abort_requested(); });
  }
  // Aborts every communicator still alive, without waiting for a worker inside its slot. Never
  // throws; idempotent.
  void abort_all() noexcept {
    for (auto& slot : slots_) slot->slot.abort();
  }
  // Destroys rank r's communicator: aborts it when the group was aborted (Note [NCCL teardown]).
  void release(int r, bool abort) noexcept {
    Slot& slot = *slots_[r];
    if (abort) return slot.slot.abort();
    slot.slot.release([&] { (void)ncclCommDestroy(slot.comm); });
  }

 private:
  struct Slot {
    explicit Slot(ncclComm_t c) : comm(c), slot([c] { (void)ncclCommAbort(c); }) {}
    ncclComm_t comm;
    AbortableSlot slot;
  };

  std::vector<std::unique_ptr<Slot>> slots_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device_id, std::shared_ptr<NcclComms> comms, int local,
                   std::unique_ptr<Communicator> control)
      : rank_(rank),
        size_(size),
        device_id_(device_id),
        comms_(std::move(comms)),
        local_(local),
        control_(std::move(control)) {}

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override {  // Note [NCCL teardown]
    DeviceGuard guard(device_id_);
    comms_->release(local_, control_->aborted());
    // The stream and events belong to our device: released here, while it is current, rather
    // than after the guard (this may run on a thread whose current device is another GPU).
    async_ = AsyncCollectives{};
    done_.reset();
    ready_.reset();
    comm_stream_.reset();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string describe() const override {
    return fmt::format("nccl: {} rank{}, a GPU each", size(), size() == 1 ? "" : "s");
  }

  void bind(const DeviceQueue& queue) override {
    compute_ = bound_stream("NCCL communicator", rank_, device_id_, queue);
    comm_stream_ = make_stream();
    name_stream(comm_stream_.get(), fmt::format("rank {} NCCL", rank_));
    ready_ = make_event();
    done_ = make_event();
    async_.bind(compute_, comm_stream_.get(), [this] { return aborted(); });
  }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    all_reduce_of(data, count, ncclFloat, op);
  }

  // bf16 on the wire, half the bytes; NCCL sums in its reduction kernels and rounds to bf16.
  void all_reduce_bf16(std::uint16_t* data, std::size_t count, ReduceOp op) override {
    all_reduce_of(data, count, ncclBfloat16, op);
  }

  void broadcast(float* data, std::size_t count, int root) override {
    if (root < 0 || root >= size_) throw std::invalid_argument("broadcast: root out of range");
    if (count == 0) return check_not_aborted();
    enqueue([&](ncclComm_t comm, cudaStream_t stream) {
      NCCL_START(ncclBroadcast(data, data, count, ncclFloat, root, comm, stream));
    });
  }

  // Note [NCCL shards]
  void reduce_scatter(float* data, std::size_t count, std::size_t grain, ReduceOp op) override {
    if (count == 0) return check_not_aborted();
    const ncclRedOp_t nccl_op = op == ReduceOp::avg ? ncclAvg : ncclSum;
    enqueue([&](ncclComm_t comm, cudaStream_t stream) {
      if (const std::size_t shard = equal_shard(count, grain)) {
        float* mine = data + static_cast<std::size_t>(rank_) * shard;
        NCCL_START(ncclReduceScatter(data, mine, shard, ncclFloat, nccl_op, comm, stream));
        return;
      }
      for (int root = 0; root < size_; ++root) {
        const ShardRange s = shard_range(count, size_, root, grain);
        if (s.size() == 0) continue;
        float* at = data + s.begin;
        NCCL_START(ncclReduce(at, at, s.size(), ncclFloat, nccl_op, root, comm, stream));
      }
    });
  }

  void all_gather(float* data, std::size_t count, std::size_t grain) override {
    if (count == 0) return check_not_aborted();
    enqueue([&](ncclComm_t comm, cudaStream_t stream) {
      if (const std::size_t shard = equal_shard(count, grain)) {
        const float* mine = data + static_cast<std::size_t>(rank_) * shard;
        NCCL_START(ncclAllGather(mine, data, shard, ncclFloat, comm, stream));
        return;
      }
      for (int root = 0; root < size_; ++root) {
        const ShardRange s = shard_range(count, size_, root, grain);
        if (s.size() == 0) continue;
        float* at = data + s.begin;
        NCCL_START(ncclBroadcast(at, at, s.size(), ncclFloat, root, comm, stream));
      }
    });
  }

  // Every host-side meeting first polls NCCL for an asynchronous error (a peer that died, a
  // network failure): collectives run on streams, so their errors surface here, not as returns.
  void barrier() override {
    check_async_error();
    control_->barrier();
  }
  void all_reduce_host(std::span<double> values) override {
    check_async_error();
    control_->all_reduce_host(values);
  }
  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override {
    check_async_error();
    return control_->all_gather_host(value);
  }

  // Note [NCCL abort]: the control group first, which wakes every rank at a barrier, then every
  // NCCL communicator of the process, which ends their kernels and so every device wait.
  void abort() noexcept override {
    control_->abort();
    comms_->abort_all();
  }
  bool aborted() const noexcept override { return control_->aborted(); }

  // Note [NCCL teardown]: after an abort, the NCCL kernels end without their peers; a stream
  // still busy then is left to the device, which keeps memory it cannot free safely.
  void drain() noexcept override {
    drain_stream(comm_stream_.get(), device_id_, [this] { return aborted(); });
  }

 protected:
  // Note [Stream work]: the collective is enqueued as usual, but its end is recorded in the
  // work's own event, which only wait() makes the compute stream wait for.
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    return async_.start(collective);
  }

 private:
  // In place, on the communication stream.
  void all_reduce_of(void* data, std::size_t count, ncclDataType_t type, ReduceOp op) {
    if (count == 0) return check_not_aborted();  // the same count on every rank
    const ncclRedOp_t nccl_op = op == ReduceOp::avg ? ncclAvg : ncclSum;
    enqueue([&](ncclComm_t comm, cudaStream_t stream) {
      NCCL_START(ncclAllReduce(data, data, count, type, nccl_op, comm, stream));
    });
  }


  void check_not_aborted() const {
    if (control_->aborted()) throw CommAborted();
  }
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    (void)comms_->use(local_, [&](ncclComm_t comm) {
      NCCL_START(ncclCommGetAsyncError(comm, &async));
    });
    if (async != ncclSuccess && async != ncclInProgress)
      throw std::runtime_error(fmt::format("NCCL asynchronous error on rank {}: {}", rank_,
                                           ncclGetErrorString(async)));
  }
  // The size of every rank's shard when they are all equal, else 0.
  std::size_t equal_shard(std::size_t count, std::size_t grain) const {
    const std::size_t n = static_cast<std::size_t>(size_);
    return count % (n * grain) == 0 ? count / n : 0;
  }
  // Note [NCCL ordering]: meets the other ranks, then, inside the communicator's slot (Note
  // [NCCL abort]), orders the comm stream after the compute stream's work so far and runs
  // body(comm, comm stream) as one NCCL group; once NCCL has enqueued it (Note [Non-blocking
  // NCCL]), orders what follows after it: the compute stream's later work, or, for an async
  // collective, its work's end event.
  template <class Body>
  void enqueue(Body&& body) {
    if (!compute_) throw std::logic_error("NCCL communicator: attach() was not called");
    check_async_error();
    control_->barrier();
    const cudaStream_t stream = comm_stream_.get();
    StreamWork* deferred = async_.deferred();
    const bool entered = comms_->use(local_, [&](ncclComm_t comm) {
      CUDA_CHECK(cudaEventRecord(ready_.get(), compute_));
      CUDA_CHECK(cudaStreamWaitEvent(stream, ready_.get(), 0));
      if (deferred) deferred->record_start(stream);
      NcclGroup group;
      body(comm, stream);
      group.end();
    });
    // Note [Non-blocking NCCL]: the group's kernels are on the stream once NCCL says so.
    if (!entered || !comms_->wait_done(local_, [this] { return aborted(); })) throw CommAborted();
    if (deferred) return deferred->record_end(stream);
    CUDA_CHECK(cudaEventRecord(done_.get(), stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0));
  }

  const int rank_, size_, device_id_;
  std::shared_ptr<NcclComms> comms_;
  const int local_;  // index into comms_
  std::unique_ptr<Communicator> control_;
  cudaStream_t compute_ = nullptr;  // the device's, from bind()
  Stream comm_stream_;
  Event ready_, done_;
  AsyncCollectives async_;
};

// Ranks first_rank... of `world`, one per device of device_ids, made non-blocking (Note
// [Non-blocking NCCL]) inside one group, as one thread must make several ranks; returns once
// every one is ready. On an error the ones made are aborted.
std::vector<ncclComm_t> init_ranks(std::span<const int> device_ids, const ncclUniqueId& id,
                                   int first_rank, int world) {
  const int n = static_cast<int>(device_ids.size());
  std::vector<ncclComm_t> comms(n, nullptr);
  const auto abort_made = [&] {
    for (ncclComm_t c : comms)
      if (c) (void)ncclCommAbort(c);
  };
  try {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NcclGroup group;
    for (int r = 0; r < n; ++r) {
      // ncclCommInitRankConfig takes the current device; the caller's is current again after
      // each call, even one that throws.
      const DeviceGuard on(device_ids[r]);
      NCCL_START(ncclCommInitRankConfig(&comms[r], world, id, first_rank + r, &config));
    }
    group.end();
    for (ncclComm_t c : comms) {
      ncclResult_t state = ncclSuccess;
      (void)poll_until_done(
          "ncclCommInitRankConfig (then ncclCommGetAsyncError)",
          [&] {
            NCCL_START(ncclCommGetAsyncError(c, &state));
            return state;
          },
          [] { return false; });
    }
  } catch (...) {
    abort_made();
    throw;
  }
  return comms;
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(
    std::span<const int> device_ids, std::shared_ptr<ProcessGroup> processes) {
  const int n = static_cast<int>(device_ids.size());
  if (n < 1) throw std::invalid_argument("make_nccl_group: no devices");
  connect_eagerly();
  std::vector<std::unique_ptr<Communicator>> control = make_shared_memory_group(n);
  int first_rank = 0, world = n;
  const bool across = processes && processes->size() > 1;
  ncclUniqueId id{};
  if (across) {  // Note [NCCL across processes]
    first_rank = processes->rank() * n;
    world = processes->size() * n;
    if (processes->rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    processes->broadcast_bytes(&id, sizeof id, 0);
  } else {
    NCCL_CHECK(ncclGetUniqueId(&id));
  }
  const std::vector<ncclComm_t> comms = init_ranks(device_ids, id, first_rank, world);
  if (across) control = make_hierarchical_group(std::move(control), std::move(processes));
  auto owner = std::make_shared<NcclComms>(comms);
  std::vector<std::unique_ptr<Communicator>> group;
  group.reserve(n);
  for (int r = 0; r < n; ++r)
    group.push_back(std::make_unique<NcclCommunicator>(first_rank + r, world, device_ids[r],
                                                       owner, r, std::move(control[r])));
  return group;
}

}  // namespace lockstep::cuda
