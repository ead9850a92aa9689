// Communicator::attach hands the communicator its device's queue (Device::queue()), which is
// all a communicator learns of the device: no cast of the Device.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "group_of_one.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;

namespace {

// Records what bind() received.
class RecordingCommunicator final : public test::GroupOfOne {
 public:
  void bind(const DeviceQueue& queue) override { bound = queue; }
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
