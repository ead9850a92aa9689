// A group of one rank, every collective the identity: the base of the tests' fake
// communicators, which override only what they are about.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep::test {

class GroupOfOne : public Communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  void all_reduce(float*, std::size_t, ReduceOp) override {}
  void broadcast(float*, std::size_t, int) override {}
  void reduce_scatter(float*, std::size_t, std::size_t, ReduceOp) override {}
  void all_gather(float*, std::size_t, std::size_t) override {}
  void barrier() override {}
  void all_reduce_host(std::span<double>) override {}
  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override { return {value}; }
  void abort() noexcept override {}
  bool aborted() const noexcept override { return false; }
};

}  // namespace lockstep::test
