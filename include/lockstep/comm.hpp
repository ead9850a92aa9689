// Communicators: how the workers of one run talk to each other.
//
// Every worker holds its own Communicator; together they form a group of size() ranks.
// Collectives must be called by every rank, in the same order.
//
//   comm.all_reduce(grads, n, lockstep::ReduceOp::avg);   // device memory
//   comm.barrier();                                        // host, blocking
//
// Data-plane calls take device memory and are ordered on the device's queue. Control-plane
// calls take host memory and block. If any rank fails, it calls abort(): every rank blocked in
// a collective, or entering one later, throws CommAborted instead of hanging.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/error.hpp"
#include "lockstep/export.hpp"

namespace lockstep {

class Device;
struct DeviceQueue;

enum class ReduceOp { sum, avg };

// The part of a buffer of `count` elements that `rank` of `ranks` owns in reduce_scatter and
// all_gather: the buffer is cut into grains of `grain` elements (the last one may be short),
// and rank r takes a contiguous run of them, the first count_of_grains % ranks ranks one more
// than the others. So any count and any rank count are covered exactly once, without padding;
// a rank may own nothing when there are fewer grains than ranks. With grain 1 these are the
// slices the CPU all-reduce sums.
struct ShardRange {
  std::size_t begin = 0;  // elements
  std::size_t end = 0;
  std::size_t size() const noexcept { return end - begin; }
};
inline ShardRange shard_range(std::size_t count, int ranks, int rank, std::size_t grain = 1) {
  const std::size_t grains = (count + grain - 1) / grain;
  const std::size_t n = static_cast<std::size_t>(ranks), r = static_cast<std::size_t>(rank);
  const std::size_t base = grains / n, extra = grains % n;
  const std::size_t first = r * base + std::min(r, extra);
  const std::size_t last = first + base + (r < extra ? 1 : 0);
  return {std::min(first * grain, count), std::min(last * grain, count)};
}

// When a collective ran, and what it cost the worker's queue (CommWork::timing).
struct CommTiming {
  double started_s = 0.0;  // host times, seconds on the steady clock; equal when not timed
  double finished_s = 0.0;
  double exposed_s = 0.0;  // how long the worker's queue stood still waiting for it
};

// A collective in flight. wait() returns once its result may be used on the worker's queue (on
// a GPU: the compute stream is ordered after it, without blocking the host) and rethrows its
// error. After wait(), timing() says when it ran and how long the queue waited for it: on the
// CPU the host blocked in wait(); on a GPU the compute stream stood still behind the comm
// stream, measured with CUDA events. It is nullopt while the device has not got that far (ask
// again later), and zero times for backends that do not time their collectives.
class LOCKSTEP_API CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
  virtual std::optional<CommTiming> timing() { return CommTiming{}; }
};

class LOCKSTEP_API Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // What moves the data, in words, for the summary ("nccl", "peer: ...", "shared memory");
  // empty where the communicator does not say.
  virtual std::string describe() const { return {}; }

  // Tells the communicator which device its worker computes on: binds device.queue(), and makes
  // the device's waits end once the group is aborted (Device::set_abort_check), since work
  // queued behind a collective whose peer died may never finish. Called once, on the worker's
  // thread, after the device is created and before any collective. The device must go before
  // the communicator.
  void attach(Device& device);
  // What attach() hands over: the queue to order data-plane calls on, and the device it belongs
  // to, which the communicator checks against the one it was made for. The default ignores it,
  // for communicators whose collectives finish before they return (the CPU's).
  virtual void bind(const DeviceQueue& /*queue*/) {}

  // Data plane. Every rank ends with bit-identical contents.
  virtual void all_reduce(float* data, std::size_t count, ReduceOp op) = 0;
  virtual void broadcast(float* data, std::size_t count, int root) = 0;

  // Reduce-scatter, in place: on return this rank's shard of data (shard_range(count, size(),
  // rank(), grain)) holds the sum or average over ranks of that shard, with the bits all_reduce
  // gives those elements; the rest of data is unspecified. ZeRO-1's gradient reduction.
  virtual void reduce_scatter(float* data, std::size_t count, std::size_t grain, ReduceOp op) = 0;
  // All-gather, in place: on entry each rank's shard of data holds its part; on return every
  // rank holds every shard, bit for bit.
  virtual void all_gather(float* data, std::size_t count, std::size_t grain) = 0;

  // all_reduce of bf16 values (their bits, src/common/bf16.hpp), summed in fp32 and rounded to
  // bf16 once, to nearest even. The default widens them to fp32 in host memory, all_reduce()s
  // that and rounds the result: right for communicators over host memory (the CPU's). A GPU
  // communicator overrides it (NCCL: ncclBfloat16 on the wire) or refuses.
  virtual void all_reduce_bf16(std::uint16_t* data, std::size_t count, ReduceOp op);

  // Start a collective that runs while the caller goes on (DDP's bucket all-reduce). They run in
  // the order they were started, on every rank the same (see start()).
  std::unique_ptr<CommWork> all_reduce_async(float* data, std::size_t count, ReduceOp op);
  std::unique_ptr<CommWork> reduce_scatter_async(float* data, std::size_t count,
                                                 std::size_t grain, ReduceOp op);
  std::unique_ptr<CommWork> all_gather_async(float* data, std::size_t count, std::size_t grain);
  std::unique_ptr<CommWork> all_reduce_bf16_async(std::uint16_t* data, std::size_t count,
                                                  ReduceOp op);

  // Control plane.
  virtual void barrier() = 0;
  // values[i] = sum over ranks of values[i]; identical on every rank.
  virtual void all_reduce_host(std::span<double> values) = 0;
  // Returns every rank's value, indexed by rank.
  virtual std::vector<std::uint64_t> all_gather_host(std::uint64_t value) = 0;

  // Stops the whole group; callable from any thread (a failing worker, a watchdog). Wakes every
  // rank waiting in the group; they and all later collectives throw CommAborted. Idempotent;
  // never throws.
  virtual void abort() noexcept = 0;
  virtual bool aborted() const noexcept = 0;

  // Returns once this rank's collectives no longer touch any buffer, its own or a peer's: what
  // a worker calls before it frees its buffers, on every path (Note [Failure] in
  // src/train/worker_loop.hpp). A collective whose work was enqueued on a device may still run
  // after its CommWork was dropped. The default does nothing, for communicators whose
  // collectives are done when they return or are waited for. Never throws.
  virtual void drain() noexcept {}

 protected:
  // Runs `collective`, one of this communicator's data-plane calls, after those started before
  // it. The default runs it at once and returns a finished CommWork; the CPU's run it on the
  // rank's communication thread, the GPU's enqueue it on their comm stream and leave the compute
  // stream free until wait().
  virtual std::unique_ptr<CommWork> start(std::function<void()> collective);
};

// The CPU backend's in-process group: `size` communicators over shared memory. Each rank
// reduces its 1/size slice across every rank's buffer and writes the sum into every rank's
// buffer (reduce_scatter writes it into its own only; all_gather copies the other ranks'
// shards). Async collectives run on one communication thread per rank.
//
// For benchmarks, the environment variable LOCKSTEP_EMULATE_INTERCONNECT="ALPHA_US,GBPS" adds
// a delay of alpha + 2(n-1)/n * bytes / bandwidth to every data-plane all-reduce (alpha +
// (n-1)/n * bytes / bandwidth to a reduce-scatter or all-gather), as a wire of that latency and
// bandwidth would; the CPU is free meanwhile.
LOCKSTEP_API std::vector<std::unique_ptr<Communicator>> make_shared_memory_group(int size);

// The processes of a multi-process run: one per node, each owning that node's devices, started
// by mpirun or srun. Workers get global ranks: process rank x local workers + local index.
//
//   std::shared_ptr<lockstep::ProcessGroup> processes = lockstep::make_mpi_processes();
//   lockstep::Trainer trainer(cfg, train, eval, processes);   // null: this process alone
//
// All calls take host memory and block. Two planes, as in Communicator: the data plane
// (all_reduce and broadcast of floats) and the control plane (the rest) may each be used by one
// thread of a process at a time, concurrently with the other plane, and every process issues
// each plane's calls in the same order.
class LOCKSTEP_API ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  // Data plane: data[i] = sum over processes of data[i], identical bits in every process.
  virtual void all_reduce(float* data, std::size_t count) = 0;
  virtual void broadcast(float* data, std::size_t count, int root) = 0;

  // Control plane.
  virtual void barrier() = 0;
  virtual void all_reduce(std::span<double> values) = 0;
  // Every process contributes mine.size() values (the same size everywhere); returns them all,
  // process 0's first.
  virtual std::vector<std::uint64_t> all_gather(std::span<const std::uint64_t> mine) = 0;
  virtual void broadcast_bytes(void* data, std::size_t bytes, int root) = 0;

  // Ends every wait of this process in the group: the waiting calls, and all later ones, throw
  // CommAborted. Processes on other nodes are not told (those on this node are, through the
  // shared-memory data plane, and abort too); after the local clean stop, the top level ends
  // the whole job with abort_job(). Callable from any thread; never throws.
  virtual void abort() noexcept = 0;
  virtual bool aborted() const noexcept = 0;
  // Ends every process of the job with exit status `code` (MPI_Abort). For the top level only
  // (the CLI, an embedder's main), never library code.
  virtual void abort_job(int code) noexcept = 0;
};

// The MPI processes this one was launched with (mpirun, or srun under Slurm): MPI is
// initialised here and finalised when the last reference goes. Null when this build has no MPI
// or no MPI launcher started this process: then everything runs in this process alone. Call it
// once, early in main(), before other threads start.
LOCKSTEP_API std::shared_ptr<ProcessGroup> make_mpi_processes();
// The MPI library this build uses ("Open MPI v4.1.4, ..."), or empty without MPI support.
LOCKSTEP_API std::string mpi_library();

// A group spanning processes: `local` (one communicator per worker of this process, as from
// make_shared_memory_group) joined with the same group of every other process. Each collective
// reduces within the process, then local worker 0 all-reduces across processes, then the result
// is shared within the process; see Note [Hierarchical all-reduce] in
// src/comm/hierarchical_comm.cpp. Every process must have the same number of local workers.
LOCKSTEP_API std::vector<std::unique_ptr<Communicator>> make_hierarchical_group(
    std::vector<std::unique_ptr<Communicator>> local, std::shared_ptr<ProcessGroup> processes);

}  // namespace lockstep
