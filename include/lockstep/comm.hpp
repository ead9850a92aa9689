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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "lockstep/error.hpp"

namespace lockstep {

class Device;

enum class ReduceOp { sum, avg };

// A collective in flight. wait() returns once its result may be used on the worker's queue (on
// a GPU: the compute stream is ordered after it, without blocking the host) and rethrows its
// error. started_s/finished_s are host times (seconds on the steady clock) when known, for
// traces; both are 0 when the backend does not time its collectives on the host.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
  double started_s = 0.0;
  double finished_s = 0.0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  // Tells the communicator which device (and so which queue) its worker computes on. Called
  // once, on the worker's thread, after the device is created and before any collective.
  virtual void attach(Device& /*device*/) {}

  // Data plane. Every rank ends with bit-identical contents.
  virtual void all_reduce(float* data, std::size_t count, ReduceOp op) = 0;
  virtual void broadcast(float* data, std::size_t count, int root) = 0;
  // Starts an all-reduce that runs while the caller goes on (DDP's bucket all-reduce). Async
  // all-reduces run in the order they were started, on every rank the same. The default runs
  // all_reduce() at once, which suits backends whose all_reduce only enqueues work on a stream.
  virtual std::unique_ptr<CommWork> all_reduce_async(float* data, std::size_t count, ReduceOp op);

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
};

// The CPU backend's in-process group: `size` communicators over shared memory. Each rank
// reduces its 1/size slice across every rank's buffer, then copies the other slices back.
// Async all-reduces run on one communication thread per rank.
//
// For benchmarks, the environment variable LOCKSTEP_EMULATE_INTERCONNECT="ALPHA_US,GBPS" adds
// a delay of alpha + 2(n-1)/n * bytes / bandwidth to every data-plane all-reduce, as a wire of
// that latency and bandwidth would; the CPU is free meanwhile.
std::vector<std::unique_ptr<Communicator>> make_shared_memory_group(int size);

}  // namespace lockstep
