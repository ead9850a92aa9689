// Communicator::attach hands the communicator its device's queue (Device::queue()), which is
// all a communicator learns of the device: no cast of the Device.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;

namespace {

// Records what bind() received; every collective is the identity of a group of one.
class RecordingCommunicator final : public Communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  void bind(const DeviceQueue& queue) override { bound = queue; }
  void all_reduce(float*, std::size_t, ReduceOp) override {}
  void broadcast(float*, std::size_t, int) override {}
  void reduce_scatter(float*, std::size_t, std::size_t, ReduceOp) override {}
  void all_gather(float*, std::size_t, std::size_t) override {}
  void barrier() override {}
  void all_reduce_host(std::span<double>) override {}
  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override { return {value}; }
  void abort() noexcept override {}
  bool aborted() const noexcept override { return false; }

  std::optional<DeviceQueue> bound;
};

}  // namespace

TEST_CASE("attach binds the device's queue; a CPU device's queue is the calling thread") {
  auto device = make_cpu_device(/*id=*/3, /*threads=*/1);
  RecordingCommunicator comm;
  comm.attach(*device);
  REQUIRE(comm.bound.has_value());
  CHECK(comm.bound->backend == "cpu");
  CHECK(comm.bound->device_id == 3);
  CHECK(comm.bound->cuda_stream == nullptr);
}
