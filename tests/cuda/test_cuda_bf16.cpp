// The CUDA side of bf16 (issue 16): the conversion kernels against the CPU device bit for bit,
// and the NCCL communicator's bf16 all-reduce against the CPU's rounding. Skip without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "common/bf16.hpp"
#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

// Random floats, then every special case of Note [Rounding to bf16] at the front.
std::vector<float> bf16_inputs() {
  std::vector<float> x = random_floats(100003, 21, -3e4, 3e4);
  const std::uint32_t specials[] = {0x3F808000u, 0x3F818000u, 0x7F7F8000u, 0x7F800000u,
                                    0xFF800000u, 0x7FC00001u, 0xFFFFFFFFu, 0x00008000u,
                                    0x00018000u, 0x80000000u, 0x007FFFFFu, 0x7F7F7FFFu};
  for (std::size_t i = 0; i < std::size(specials); ++i)
    x[i] = detail::float_of_bits(specials[i]);
  return x;
}

// The bits of to_bf16 on `dev`, and the floats from_bf16 makes of them.
std::pair<std::vector<std::uint16_t>, std::vector<float>> round_trip(Device& dev,
                                                                     const std::vector<float>& x) {
  auto xd = on_device(dev, x);
  DeviceArray<std::uint16_t> h(dev, x.size());
  DeviceArray<float> back(dev, x.size());
  dev.to_bf16(xd.data(), h.data(), x.size());
  dev.from_bf16(h.data(), back.data(), x.size());
  return {h.download(), back.download()};
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuda: to_bf16 and from_bf16 give the CPU device's bits") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    const std::vector<float> x = bf16_inputs();
    const auto [gpu_bits, gpu_back] = round_trip(*gpu, x);
    const auto [cpu_bits, cpu_back] = round_trip(*cpu, x);
    CHECK(gpu_bits == cpu_bits);
    CHECK(std::memcmp(gpu_back.data(), cpu_back.data(), x.size() * sizeof(float)) == 0);
  }

  TEST_CASE("cuda: the NCCL bf16 all-reduce averages bf16 values; the peer communicator refuses") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    const int gpus = static_cast<int>(backend->devices().size());
    std::vector<int> ids(static_cast<std::size_t>(std::min(gpus, 2)));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    // Rank r holds r + 1 (exact in bf16); the average of 1..n is (n + 1) / 2, a bf16 too.
    auto comms = backend->create_communicators(ids);
    const int n = static_cast<int>(ids.size());
    std::vector<std::thread> threads;
    std::vector<std::vector<std::uint16_t>> got(ids.size());
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        auto dev = backend->create_device(ids[r], n, 0);
        comms[r]->attach(*dev);
        const std::vector<std::uint16_t> x(1000, detail::float_to_bf16(float(r + 1)));
        auto xd = on_device(*dev, x);
        comms[r]->all_reduce_bf16(xd.data(), x.size(), ReduceOp::avg);
        got[r] = xd.download();
      });
    for (auto& t : threads) t.join();
    for (const auto& g : got)
      CHECK(g == std::vector<std::uint16_t>(1000, detail::float_to_bf16(0.5f * float(n + 1))));

    auto peer = make_backend(BackendKind::cuda, {}, {.comm = CommKind::peer});
    auto peers = peer->create_communicators(std::vector<int>{0});
    auto dev = peer->create_device(0, 1, 0);
    peers[0]->attach(*dev);
    DeviceArray<std::uint16_t> h(*dev, 4);
    CHECK_THROWS_AS(peers[0]->all_reduce_bf16(h.data(), 4, ReduceOp::avg), InputError);
  }
}
