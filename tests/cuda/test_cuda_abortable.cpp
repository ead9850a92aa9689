// A CUDA device's host waits end when the group aborts (Note [Abortable waits]), even behind
// work that never finishes: a host function that blocks the compute stream until the test
// releases it stands in for a collective whose peer died. Built with the CUDA backend only; each
// case skips without a GPU.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "gpu_vs_cpu.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;
using namespace std::chrono_literals;

namespace {

// Runs on CUDA's callback thread; makes no CUDA call.
void CUDART_CB hold_stream(void* released) {
  const auto& flag = *static_cast<std::atomic<bool>*>(released);
  while (!flag.load()) std::this_thread::sleep_for(1ms);
}

// `read` on another thread while the device's stream is held; the group aborts 50 ms later. The
// read must end with CommAborted within `limit`. The stream is released afterwards either way,
// so a read that did not end (the bug) finishes and the test fails instead of hanging.
void check_read_aborts(Device& device, const std::function<void()>& read) {
  std::atomic<bool> released{false}, aborted{false};
  device.set_abort_check([&] { return aborted.load(); });
  REQUIRE(cudaLaunchHostFunc(device.queue().cuda_stream, hold_stream, &released) == cudaSuccess);
  std::future<void> reader = std::async(std::launch::async, read);
  std::this_thread::sleep_for(50ms);
  CHECK(reader.wait_for(0ms) == std::future_status::timeout);  // it does wait for the stream
  aborted = true;
  const bool ended = reader.wait_for(2s) == std::future_status::ready;
  released = true;
  CHECK_MESSAGE(ended, "the read did not end within 2 s of the abort");
  CHECK_THROWS_AS(reader.get(), CommAborted);
  device.set_abort_check(nullptr);
  device.synchronize();  // the held stream has drained
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuda: copy_to_host behind a held stream ends when the group aborts, small or chunked") {
    auto backend = test::cuda_or_skip();
    if (!backend) return;
    auto device = backend->create_device(0, 1, 0);
    // The step record's size, and more than the two 4 MiB staging chunks.
    for (const std::size_t floats : {std::size_t{6}, std::size_t{3} << 20}) {
      CAPTURE(floats);
      void* memory = device->allocate(floats * sizeof(float));
      std::vector<float> host(floats);
      check_read_aborts(*device, [&] {
        device->copy_to_host(host.data(), memory, floats * sizeof(float));
      });
      // And the copy still works once nothing holds the stream.
      std::vector<float> ones(floats, 1.0f);
      device->copy_to_device(memory, ones.data(), floats * sizeof(float));
      device->copy_to_host(host.data(), memory, floats * sizeof(float));
      CHECK(host == ones);
      device->deallocate(memory);
    }
  }
}
