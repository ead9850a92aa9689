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

  // Control plane.
  virtual void barrier() = 0;
  // values[i] = sum over ranks of values[i]; identical on every rank.
  virtual void all_reduce_host(std::span<double> values) = 0;
  // Returns every rank's value, indexed by rank.
  virtual std::vector<std::uint64_t> all_gather_host(std::uint64_t value) = 0;

  // Called by a failing rank (on its own thread). Wakes every rank waiting in the group; they
  // and all later collectives throw CommAborted. Idempotent; never throws.
  virtual void abort() noexcept = 0;
  virtual bool aborted() const noexcept = 0;
};

// The CPU backend's in-process group: `size` communicators over shared memory. Each rank
// reduces its 1/size slice across every rank's buffer, then copies the other slices back.
std::vector<std::unique_ptr<Communicator>> make_shared_memory_group(int size);

}  // namespace lockstep
