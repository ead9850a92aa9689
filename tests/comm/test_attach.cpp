// Communicator::attach hands the communicator its device's queue (Device::queue()), which is
// all a communicator learns of the device: no cast of the Device; and it makes the device's
// waits end when the group is aborted.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <thread>
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

// A group whose abort() a test calls from another thread.
class AbortableGroupOfOne final : public test::GroupOfOne {
 public:
  void abort() noexcept override { aborted_.store(true); }
  bool aborted() const noexcept override { return aborted_.load(); }

 private:
  std::atomic<bool> aborted_{false};
};

}  // namespace

TEST_CASE("attach binds the device's queue, and a CPU device's queue is the calling thread") {
  auto device = make_cpu_device(/*id=*/3, /*threads=*/1);
  RecordingCommunicator comm;
  comm.attach(*device);
  REQUIRE(comm.bound.has_value());
  CHECK(comm.bound->backend == "cpu");
  CHECK(comm.bound->device_id == 3);
  CHECK(comm.bound->cuda_stream == nullptr);
}

// Note [Abortable waits]: a device wait that nothing else would end returns, by throwing, once
// another thread aborts the group the device is attached to.
TEST_CASE("attach makes the device's waits end when the group is aborted") {
  auto device = make_cpu_device(0, 1);
  AbortableGroupOfOne comm;
  comm.attach(*device);
  int polls = 0;
  device->wait_until([&] { return ++polls == 3; });  // ends by itself: not aborted
  CHECK(polls == 3);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    comm.abort();
  });
  CHECK_THROWS_AS(device->wait_until([] { return false; }), CommAborted);
  aborter.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 0.05);
  CHECK(took < 2.0);
  CHECK(device->abort_requested());
}
