// Downloads (Note [Downloads] in lockstep/device.hpp) on the GPU and, the reference, the CPU
// device: a download copies what the kernels queued before it made, into pinned memory, and a
// writer queued after fence() waits for it on the device. 64 MiB, so that a writer not held back
// would overtake the copy. Skip without a GPU.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

TEST_SUITE("cuda") {
  TEST_CASE("cuda: a download copies what was queued before it, and a fenced writer waits for it") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    const std::size_t n = (std::size_t{64} << 20) / sizeof(float) + 3, split = n / 3 + 1;
    const std::vector<float> values = random_floats(n, 910);
    for (Device* d : {cpu.get(), gpu.get()}) {
      CAPTURE(d->label());
      DeviceArray<float> src = on_device(*d, values);
      const HostMemory host = d->allocate_host(n * sizeof(float));
      float* out = reinterpret_cast<float*>(host.get());
      std::unique_ptr<Download> download = d->make_download();
      CHECK(download->done());  // before any start
      d->scale(src.data(), 2.0f, n);  // queued before start(): the copy sees it
      // Two pieces, the second first in host memory: each lands where it is told.
      const Transfer copies[] = {{out + (n - split), src.data(), split * sizeof(float)},
                                 {out, src.data() + split, (n - split) * sizeof(float)}};
      const std::uint64_t syncs = d->host_syncs();
      download->start(copies);
      download->fence();
      d->fill(src.data(), -1.0f, n);  // the next writer, after the fence
      CHECK(d->host_syncs() == syncs);  // neither start nor fence waits
      download->wait();
      CHECK(download->done());
      std::vector<float> expected(n);
      for (std::size_t i = 0; i < split; ++i) expected[n - split + i] = 2.0f * values[i];
      for (std::size_t i = split; i < n; ++i) expected[i - split] = 2.0f * values[i];
      CHECK(std::memcmp(out, expected.data(), n * sizeof(float)) == 0);
      CHECK(src.download() == std::vector<float>(n, -1.0f));
    }
  }
}
