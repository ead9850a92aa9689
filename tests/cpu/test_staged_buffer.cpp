// The default StagedBuffer (the CPU device's): a stage() is visible once it returns, and two
// buffers in turn carry a sequence of batches as the trainer's double buffering does.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "../random_data.hpp"
#include "lockstep/device.hpp"

using lockstep::test::random_floats;

TEST_CASE("cpu device: staged buffers carry batches in turn") {
  auto dev = lockstep::make_cpu_device(0, 1);
  constexpr std::size_t n = 1000;
  std::unique_ptr<lockstep::StagedBuffer> buffers[2] = {dev->make_staged_buffer(n * sizeof(float)),
                                                        dev->make_staged_buffer(n * sizeof(float))};
  CHECK(buffers[0]->bytes() == n * sizeof(float));
  for (int round = 0; round < 4; ++round) {
    lockstep::StagedBuffer& buffer = *buffers[round % 2];
    std::vector<float> host = random_floats(n, 10 + round);
    buffer.stage(std::as_bytes(std::span(host)));
    const std::vector<float> sent = host;
    host.assign(n, 0.0f);  // the host side may be reused as soon as stage() returns
    buffer.wait();
    dev->scale(buffer.data<float>(), 2.0f, n);
    std::vector<float> back(n);
    dev->copy_to_host(back.data(), buffer.data<float>(), n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(back[i] == 2.0f * sent[i]);
  }
  // A shorter batch fills the front of the buffer.
  const std::vector<float> part = random_floats(10, 99);
  buffers[0]->stage(std::as_bytes(std::span(part)));
  buffers[0]->wait();
  std::vector<float> back(part.size());
  dev->copy_to_host(back.data(), buffers[0]->data<float>(), part.size() * sizeof(float));
  CHECK(std::memcmp(back.data(), part.data(), part.size() * sizeof(float)) == 0);
}
