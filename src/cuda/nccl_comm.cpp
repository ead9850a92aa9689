// NCCL communicators, one per rank: created together by ncclCommInitAll within one process,
// or by ncclCommInitRank across processes.
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
//   into NCCL on one communicator (an enqueue, an error poll, the abort, the destroy) holds that
//   communicator's mutex, so an abort from the watchdog thread never frees a communicator under
//   a worker's ncclAllReduce. Enqueues hold it briefly: they run after the control group's
//   barrier (Note [NCCL ordering]), when every peer is enqueuing too.
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

#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

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
//   peer. Our enqueue holds its rank's communicator lock through ncclGroupEnd (Note [NCCL
//   abort]), so a peer that never arrives (it failed after the barrier, or its device did) would
//   leave the owner blocked holding the lock, and the abort, which takes every rank's lock, blocked
//   behind it: run() would never return. So the connections are made when the communicators are
//   made (NCCL_RUNTIME_CONNECT=0), where the ranks are all present by construction (one
//   ncclCommInitAll, or one group of ncclCommInitRank after the id's broadcast), and an enqueue
//   then only queues work. It costs some start-up time and the buffers of algorithms the run may
//   never use. A user who sets NCCL_RUNTIME_CONNECT is obeyed. The variable is set before the
//   first communicator is made, on the thread that makes the workers, before they start (setenv
//   is not safe against a concurrent getenv).
void connect_eagerly() {
  static std::once_flag once;
  std::call_once(once, [] { (void)setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0); });
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
    NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

// The process's NCCL communicators (Note [NCCL abort]).
class NcclComms {
 public:
  explicit NcclComms(const std::vector<ncclComm_t>& comms) {
    for (ncclComm_t c : comms) slots_.push_back(std::make_unique<Slot>(c));
  }
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  // Calls f(comm) with local rank r's communicator, under its lock. False, without calling f,
  // once that communicator was aborted or destroyed.
  template <class F>
  bool use(int r, F&& f) {
    Slot& slot = *slots_[r];
    std::lock_guard lock(slot.mutex);
    if (slot.released) return false;
    f(slot.comm);
    return true;
  }
  // Aborts every communicator still alive. Never throws; idempotent.
  void abort_all() noexcept {
    for (auto& slot : slots_) release(*slot, /*abort=*/true);
  }
  // Destroys rank r's communicator: aborts it when the group was aborted (Note [NCCL teardown]).
  void release(int r, bool abort) noexcept { release(*slots_[r], abort); }

 private:
  struct Slot {
    explicit Slot(ncclComm_t c) : comm(c) {}
    std::mutex mutex;
    ncclComm_t comm;
    bool released = false;
  };
  static void release(Slot& slot, bool abort) noexcept {
    std::lock_guard lock(slot.mutex);
    if (slot.released) return;
    slot.released = true;
    (void)(abort ? ncclCommAbort(slot.comm) : ncclCommDestroy(slot.comm));
  }

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
      NCCL_CHECK(ncclBroadcast(data, data, count, ncclFloat, root, comm, stream));
    });
  }

  // Note [NCCL shards]
  void reduce_scatter(float* data, std::size_t count, std::size_t grain, ReduceOp op) override {
    if (count == 0) return check_not_aborted();
    const ncclRedOp_t nccl_op = op == ReduceOp::avg ? ncclAvg : ncclSum;
    enqueue([&](ncclComm_t comm, cudaStream_t stream) {
      if (const std::size_t shard = equal_shard(count, grain)) {
        float* mine = data + static_cast<std::size_t>(rank_) * shard;
        NCCL_CHECK(ncclReduceScatter(data, mine, shard, ncclFloat, nccl_op, comm, stream));
        return;
      }
      for (int root = 0; root < size_; ++root) {
        const ShardRange s = shard_range(count, size_, root, grain);
        if (s.size() == 0) continue;
        float* at = data + s.begin;
        NCCL_CHECK(ncclReduce(at, at, s.size(), ncclFloat, nccl_op, root, comm, stream));
      }
    });
  }

  void all_gather(float* data, std::size_t count, std::size_t grain) override {
    if (count == 0) return check_not_aborted();
    enqueue([&](ncclComm_t comm, cudaStream_t stream) {
      if (const std::size_t shard = equal_shard(count, grain)) {
        const float* mine = data + static_cast<std::size_t>(rank_) * shard;
        NCCL_CHECK(ncclAllGather(mine, data, shard, ncclFloat, comm, stream));
        return;
      }
      for (int root = 0; root < size_; ++root) {
        const ShardRange s = shard_range(count, size_, root, grain);
        if (s.size() == 0) continue;
        float* at = data + s.begin;
        NCCL_CHECK(ncclBroadcast(at, at, s.size(), ncclFloat, root, comm, stream));
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
      NCCL_CHECK(ncclAllReduce(data, data, count, type, nccl_op, comm, stream));
    });
  }


  void check_not_aborted() const {
    if (control_->aborted()) throw CommAborted();
  }
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    (void)comms_->use(local_, [&](ncclComm_t comm) {
      NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
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
  // Note [NCCL ordering]: meets the other ranks, then, under the communicator's lock (Note
  // [NCCL abort]), orders the comm stream after the compute stream's work so far, runs
  // body(comm, comm stream) as one NCCL group, and orders what follows after it: the compute
  // stream's later work, or, for an async collective, its work's end event.
  template <class Body>
  void enqueue(Body&& body) {
    if (!compute_) throw std::logic_error("NCCL communicator: attach() was not called");
    check_async_error();
    control_->barrier();
    const cudaStream_t stream = comm_stream_.get();
    const bool enqueued = comms_->use(local_, [&](ncclComm_t comm) {
      CUDA_CHECK(cudaEventRecord(ready_.get(), compute_));
      CUDA_CHECK(cudaStreamWaitEvent(stream, ready_.get(), 0));
      StreamWork* deferred = async_.deferred();
      if (deferred) deferred->record_start(stream);
      NcclGroup group;
      body(comm, stream);
      group.end();
      if (deferred) return deferred->record_end(stream);
      CUDA_CHECK(cudaEventRecord(done_.get(), stream));
      CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0));
    });
    if (!enqueued) throw CommAborted();
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

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(
    std::span<const int> device_ids, std::shared_ptr<ProcessGroup> processes) {
  const int n = static_cast<int>(device_ids.size());
  if (n < 1) throw std::invalid_argument("make_nccl_group: no devices");
  connect_eagerly();
  std::vector<std::unique_ptr<Communicator>> control = make_shared_memory_group(n);
  std::vector<ncclComm_t> comms(n, nullptr);
  int first_rank = 0, world = n;
  if (processes && processes->size() > 1) {  // Note [NCCL across processes]
    first_rank = processes->rank() * n;
    world = processes->size() * n;
    ncclUniqueId id{};
    if (processes->rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    processes->broadcast_bytes(&id, sizeof id, 0);
    NcclGroup group;
    for (int r = 0; r < n; ++r) {
      // ncclCommInitRank takes the current device; the caller's is current again after each
      // call, even one that throws.
      const DeviceGuard on(device_ids[r]);
      NCCL_CHECK(ncclCommInitRank(&comms[r], world, id, first_rank + r));
    }
    group.end();
    control = make_hierarchical_group(std::move(control), std::move(processes));
  } else {
    NCCL_CHECK(ncclCommInitAll(comms.data(), n, device_ids.data()));
  }
  auto owner = std::make_shared<NcclComms>(comms);
  std::vector<std::unique_ptr<Communicator>> group;
  group.reserve(n);
  for (int r = 0; r < n; ++r)
    group.push_back(std::make_unique<NcclCommunicator>(first_rank + r, world, device_ids[r],
                                                       owner, r, std::move(control[r])));
  return group;
}

}  // namespace lockstep::cuda
