// The peer communicator: every rank is a worker thread of this process, and with unified
// addressing every rank's device buffer is a pointer any rank can name.
//
// Note [Peer all-reduce]
//   The shared-memory all-reduce of src/comm, with GPU streams and events in place of host
//   loops. The host threads only exchange pointers and meet at barriers of the control group;
//   the data moves on each rank's comm stream, ordered by events, and no rank waits for a GPU.
//     1. record `ready` on the compute stream (the buffer's contents are final there);
//        publish the buffer pointer.                                                  barrier
//     2. the comm stream waits for every rank's `ready`, then a kernel sums slice r over ranks
//        0..N-1 in that order (deterministic, and the CPU group's arithmetic) into slice r of
//        our own buffer; record `reduced`.                                             barrier
//     3. the comm stream waits for each other rank's `reduced` and copies its slice from it;
//        record `done`.                                                                barrier
//     4. the compute stream waits for every rank's `done`: our later kernels cannot overwrite
//        the buffer while another rank still copies from it, nor read it before our own copies.
//   reduce_scatter is steps 1, 2 and 4 (the shards are the slices); all_gather is 1, 3 and 4,
//   copying each shard once its owner's `ready` is done.
//   Each event is recorded again only in the next collective, after barriers that every rank
//   passes once it has enqueued its waits on the previous record, so no wait sees a later one.
//   An async collective runs steps 1-3 at once (host barriers cost microseconds; the data moves
//   later, on the GPU) and leaves step 4 to its work's wait() (Note [Stream work] in
//   stream_work.hpp): its `done` is the work's own end event, published for this collective, so
//   a later collective's record cannot stand in for it.
//   A rank that fails between enqueueing a collective and waiting for it must not free its
//   buffers while another rank's kernels still read them: every rank drains its comm stream
//   (drain()) before the teardown meeting, after which buffers are freed. Our kernels wait only
//   on events recorded before a barrier every rank passed, so the comm stream always drains.
//   A rank whose GPU cannot read another's memory directly (no peer access) copies that rank's
//   slice into a local staging buffer first.
#include "cuda/peer_comm.hpp"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "cuda/bind_queue.hpp"
#include "cuda/check.hpp"
#include "cuda/handles.hpp"
#include "cuda/kernels.hpp"
#include "cuda/nvtx.hpp"
#include "cuda/stream_work.hpp"

namespace lockstep::cuda {
namespace {

// What the ranks publish to each other. Each rank writes only its own elements, then reads the
// others' after a barrier of the control group, which orders the accesses.
struct PeerGroup {
  explicit PeerGroup(std::vector<int> ids)
      : device_ids(std::move(ids)),
        buffers(device_ids.size()),
        ready(device_ids.size()),
        reduced(device_ids.size()),
        done(device_ids.size()) {}

  const std::vector<int> device_ids;
  std::vector<float*> buffers;                    // this collective's buffer, per rank
  std::vector<cudaEvent_t> ready, reduced;  // per rank, owned by that rank's communicator
  std::vector<cudaEvent_t> done;  // per rank, this collective's: its `done` or its work's end
};

// Lets the current device read `peer`'s memory. False if the hardware cannot.
bool enable_peer_access(int device, int peer) {
  int possible = 0;
  CUDA_CHECK(cudaDeviceCanAccessPeer(&possible, device, peer));
  if (!possible) return false;
  const cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // another rank on this device enabled it first
    return true;
  }
  CUDA_CHECK(status);
  return true;
}

class PeerCommunicator final : public Communicator {
 public:
  PeerCommunicator(std::shared_ptr<PeerGroup> group, int rank,
                   std::unique_ptr<Communicator> control)
      : group_(std::move(group)), rank_(rank), control_(std::move(control)) {}

  PeerCommunicator(const PeerCommunicator&) = delete;
  PeerCommunicator& operator=(const PeerCommunicator&) = delete;

  // The stream, events and staging memory belong to our device: released with it current (this
  // may run on a thread whose current device is another GPU), the memory only once the stream
  // that may still read it is idle (drain() ran before; after an abort it may not be).
  ~PeerCommunicator() override {
    const DeviceGuard guard(group_->device_ids[rank_]);
    bool idle = true;
    try {
      idle = !comm_stream_ || stream_idle(comm_stream_.get());
    } catch (...) {  // a device error: the stream's work will not finish
      idle = false;
    }
    if (!idle) (void)staging_.release();
    staging_.reset();
    async_ = AsyncCollectives{};
    done_.reset();
    reduced_.reset();
    ready_.reset();
    comm_stream_.reset();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return static_cast<int>(group_->device_ids.size()); }
  std::string describe() const override {
    return fmt::format("peer: {} worker{} of one process, over device memory", size(),
                       size() == 1 ? "" : "s");
  }

  void bind(const DeviceQueue& queue) override {
    PeerGroup& g = *group_;
    const int mine = g.device_ids[rank_];
    compute_ = bound_stream("peer communicator", rank_, mine, queue);
    comm_stream_ = make_stream();
    name_stream(comm_stream_.get(), fmt::format("rank {} peer", rank_));
    async_.bind(compute_, comm_stream_.get(), [this] { return aborted(); });
    ready_ = make_event();
    reduced_ = make_event();
    done_ = make_event();
    direct_.assign(g.device_ids.size(), true);
    for (std::size_t q = 0; q < g.device_ids.size(); ++q)
      if (g.device_ids[q] != mine) direct_[q] = enable_peer_access(mine, g.device_ids[q]);
    g.ready[rank_] = ready_.get();
    g.reduced[rank_] = reduced_.get();
  }

  // Note [Peer all-reduce]
  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    if (!publish(data, count)) return;  // 1
    reduce_mine(data, count, 1, op);
    control_->barrier();  // 2
    copy_others(data, count, 1, group_->reduced);
    finish();  // 3
  }

  // Its reduction kernel sums floats only; the default would read device memory on the host.
  // One rank has nothing to sum (one worker alone gets this group: cuda_backend.cpp).
  void all_reduce_bf16(std::uint16_t*, std::size_t count, ReduceOp) override {
    check_attached();
    if (size() == 1 || count == 0) return check_not_aborted();
    throw InputError(
        "trainer.grad_reduce_dtype: bf16 needs the NCCL communicator (trainer.comm: nccl, one "
        "GPU per worker); the peer communicator reduces fp32 only");
  }

  // Phases 1, 2 and 4 (Note [Peer all-reduce]): the shards are the slices we sum.
  void reduce_scatter(float* data, std::size_t count, std::size_t grain, ReduceOp op) override {
    if (!publish(data, count)) return;
    reduce_mine(data, count, grain, op);
    finish();
  }

  // Phases 1, 3 and 4: every shard is final once its owner's `ready` is.
  void all_gather(float* data, std::size_t count, std::size_t grain) override {
    if (!publish(data, count)) return;
    copy_others(data, count, grain, group_->ready);
    finish();
  }

  // The same protocol with one source: every rank copies the root's buffer.
  void broadcast(float* data, std::size_t count, int root) override {
    PeerGroup& g = *group_;
    const int n = size();
    if (root < 0 || root >= n) throw std::invalid_argument("broadcast: root out of range");
    check_attached();
    if (n == 1 || count == 0) return check_not_aborted();

    CUDA_CHECK(cudaEventRecord(ready_.get(), compute_));
    g.buffers[rank_] = data;
    control_->barrier();

    const cudaStream_t comm = comm_stream_.get();
    if (rank_ != root) {
      CUDA_CHECK(cudaStreamWaitEvent(comm, g.ready[root], 0));
      CUDA_CHECK(cudaStreamWaitEvent(comm, ready_.get(), 0));  // our own pending writes to data
      copy_from(root, data, g.buffers[root], count);
    }
    CUDA_CHECK(cudaEventRecord(done_.get(), comm));
    g.done[rank_] = done_.get();
    control_->barrier();

    for (int q = 0; q < n; ++q) CUDA_CHECK(cudaStreamWaitEvent(compute_, g.done[q], 0));
  }

  void barrier() override { control_->barrier(); }
  void all_reduce_host(std::span<double> values) override { control_->all_reduce_host(values); }
  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override {
    return control_->all_gather_host(value);
  }

  // Every wait of the protocol is a barrier of the control group, so aborting it is enough.
  void abort() noexcept override { control_->abort(); }
  bool aborted() const noexcept override { return control_->aborted(); }

  // Note [Peer all-reduce]: whatever happened, the comm stream's kernels end.
  void drain() noexcept override {
    drain_stream(comm_stream_.get(), group_->device_ids[rank_], [] { return false; });
  }

 protected:
  // Note [Stream work]: steps 1-3 now, step 4 in the work's wait().
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    return async_.start(collective);
  }

 private:
  void check_attached() const {
    if (!compute_) throw std::logic_error("peer communicator: attach() was not called");
  }
  void check_not_aborted() const {
    if (control_->aborted()) throw CommAborted();
  }

  // Phase 1: records `ready`, publishes the buffer, meets the others, and orders the comm
  // stream after every rank's `ready`. False when there is nothing to move (one rank, or an
  // empty buffer, the same on every rank).
  bool publish(float* data, std::size_t count) {
    PeerGroup& g = *group_;
    check_attached();
    if (size() == 1 || count == 0) {
      check_not_aborted();
      return false;
    }
    CUDA_CHECK(cudaEventRecord(ready_.get(), compute_));
    g.buffers[rank_] = data;
    control_->barrier();
    for (int q = 0; q < size(); ++q)
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream_.get(), g.ready[q], 0));
    if (StreamWork* deferred = async_.deferred()) deferred->record_start(comm_stream_.get());
    return true;
  }
  // Phase 2: our shard = the rank-order sum of every rank's shard; records `reduced`.
  void reduce_mine(float* data, std::size_t count, std::size_t grain, ReduceOp op) {
    const int n = size();
    const ShardRange mine = shard_range(count, n, rank_, grain);
    if (mine.size() > 0) {
      PeerSlices sources{};
      for (int q = 0; q < n; ++q) sources.src[q] = readable_slice(q, mine);
      launch_peer_reduce(comm_stream_.get(), sources, n, data + mine.begin, mine.size(),
                         op == ReduceOp::avg);
    }
    CUDA_CHECK(cudaEventRecord(reduced_.get(), comm_stream_.get()));
  }
  // Phase 3: every other rank's shard, copied from its buffer once its `final` event is done.
  void copy_others(float* data, std::size_t count, std::size_t grain,
                   const std::vector<cudaEvent_t>& final) {
    const PeerGroup& g = *group_;
    for (int q = 0; q < size(); ++q) {
      const ShardRange theirs = shard_range(count, size(), q, grain);
      if (q == rank_ || theirs.size() == 0) continue;
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream_.get(), final[q], 0));
      copy_from(q, data + theirs.begin, g.buffers[q] + theirs.begin, theirs.size());
    }
  }
  // Phase 4: records `done`, meets the others, and orders our compute stream after every
  // rank's `done`: nobody reads our buffer any more, and our copies have landed. For an async
  // collective, its work's wait() does the ordering (Note [Stream work]).
  void finish() {
    PeerGroup& g = *group_;
    const cudaStream_t comm = comm_stream_.get();
    StreamWork* deferred = async_.deferred();
    if (deferred) {
      deferred->record_end(comm);
      g.done[rank_] = deferred->end();
    } else {
      CUDA_CHECK(cudaEventRecord(done_.get(), comm));
      g.done[rank_] = done_.get();
    }
    control_->barrier();
    for (int q = 0; q < size(); ++q) {
      if (!deferred) CUDA_CHECK(cudaStreamWaitEvent(compute_, g.done[q], 0));
      else if (q != rank_) deferred->also_wait_for(g.done[q]);
    }
  }

  // On the comm stream: dst (ours) = count floats of rank q's src.
  void copy_from(int q, float* dst, const float* src, std::size_t count) {
    const PeerGroup& g = *group_;
    CUDA_CHECK(cudaMemcpyPeerAsync(dst, g.device_ids[rank_], src, g.device_ids[q],
                                   count * sizeof(float), comm_stream_.get()));
  }

  // Slice s of rank q's buffer, as a pointer our kernels can read: the buffer itself when our
  // GPU can address it, else a copy in our staging buffer (enqueued on the comm stream).
  const float* readable_slice(int q, ShardRange s) {
    const float* src = group_->buffers[q] + s.begin;
    if (direct_[q]) return src;
    const std::size_t need = s.size() * static_cast<std::size_t>(size());
    if (need > staging_capacity_) {
      // The old buffer may be in use. A poll, not cudaStreamSynchronize: the stream may wait
      // for a rank that failed, and the abort must reach us here (Note [Abortable waits]).
      wait_for_idle(comm_stream_.get(), [this] { return aborted(); });
      staging_ = make_device_memory(need * sizeof(float));
      staging_capacity_ = need;
    }
    float* dst = static_cast<float*>(staging_.get()) + static_cast<std::size_t>(q) * s.size();
    copy_from(q, dst, src, s.size());
    return dst;
  }

  std::shared_ptr<PeerGroup> group_;
  const int rank_;
  std::unique_ptr<Communicator> control_;
  cudaStream_t compute_ = nullptr;  // the device's, from bind()
  Stream comm_stream_;
  Event ready_, reduced_, done_;
  AsyncCollectives async_;
  std::vector<bool> direct_;        // direct_[q]: our kernels can read rank q's memory
  DeviceMemory staging_;            // slices of ranks we cannot read directly
  std::size_t staging_capacity_ = 0;  // floats
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_peer_group(std::span<const int> device_ids) {
  const int n = static_cast<int>(device_ids.size());
  if (n < 1) throw std::invalid_argument("make_peer_group: no devices");
  if (n > kMaxPeerRanks)
    throw std::invalid_argument(
        fmt::format("peer communicator: {} ranks, at most {} supported", n, kMaxPeerRanks));
  auto group = std::make_shared<PeerGroup>(std::vector<int>(device_ids.begin(), device_ids.end()));
  std::vector<std::unique_ptr<Communicator>> control = make_shared_memory_group(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(n);
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<PeerCommunicator>(group, r, std::move(control[r])));
  return comms;
}

}  // namespace lockstep::cuda
