// Shared by the CUDA tests: the backend or a skip, random inputs, one op run on the GPU and on a
// CPU device with the results compared, and a group of ranks each on its thread.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/random.hpp"
#include "lockstep/lockstep.hpp"
#include "../random_data.hpp"
#include "../skip.hpp"

namespace lockstep::test {

// The CUDA backend, or null (after saying why) when this build or this machine has none.
inline std::unique_ptr<Backend> cuda_or_skip(const BackendOptions& options = {}) {
  try {
    return make_backend(BackendKind::cuda, {}, options);
  } catch (const InputError& e) {
    skip("no usable GPU (" + std::string(e.what()) + ")");
    return nullptr;
  }
}

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// max |got - want| <= tol * max |want|, and NaN exactly where `want` has NaN.
inline void check_close(const std::vector<float>& got, const std::vector<float>& want,
                        double tol = 1e-5) {
  REQUIRE(got.size() == want.size());
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      if (std::isnan(got[i]) != std::isnan(want[i])) {
        FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
        return;
      }
      continue;
    }
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  CHECK(diff <= tol * std::max(scale, 1e-30));
}

// Runs the same op on the GPU and on a CPU device: op(device) returns the downloaded results
// to compare. tol = 0 asks for the same bits.
using Outputs = std::vector<std::vector<float>>;
inline void compare(Device& gpu, const std::function<Outputs(Device&)>& op, double tol = 1e-5) {
  auto cpu = make_cpu_device(0, 1);
  const Outputs want = op(*cpu), got = op(gpu);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    check_close(got[k], want[k], tol);
  }
}

// An output buffer of n NaNs.
inline DeviceArray<float> poisoned(Device& dev, std::size_t n) {
  return on_device(dev, std::vector<float>(n, kNaN));
}

// Runs fn(rank, device, comm) on one thread per rank, each with its own device and attached
// communicator, as the trainer does; rethrows the first failure on the calling thread.
inline void on_ranks(Backend& backend, const std::vector<int>& ids,
              const std::function<void(int, Device&, Communicator&)>& fn) {
  auto comms = backend.create_communicators(ids);
  const int n = static_cast<int>(ids.size());
  std::mutex mutex;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto device = backend.create_device(ids[r], n, 0);
        comms[r]->attach(*device);
        fn(r, *device, *comms[r]);
      } catch (...) {
        {
          std::lock_guard lock(mutex);
          if (!error) error = std::current_exception();
        }
        comms[r]->abort();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace lockstep::test
