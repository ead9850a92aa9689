// The shared-memory communicator against closed-form expectations: rank r fills its buffer
// with values derived from r and the index, and every rank must end with the exact sum.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "../compare.hpp"
#include "comm/closed_form.hpp"
#include "lockstep/comm.hpp"

using lockstep::Communicator;
using lockstep::ReduceOp;

namespace {

namespace test = lockstep::test;
using lockstep::test::expected_sum;
using lockstep::test::on_group;
using lockstep::test::value;

}  // namespace

TEST_CASE("all_reduce sums and averages exactly for any length and group size") {
  for (int n = 1; n <= 8; ++n) {
    const std::size_t n_sz = static_cast<std::size_t>(n);
    for (std::size_t len : {std::size_t{0}, std::size_t{1}, n_sz - 1, n_sz + 1, std::size_t{1} << 17,
                            (std::size_t{1} << 17) + 13}) {
      CAPTURE(n);
      CAPTURE(len);
      std::vector<std::vector<float>> sums(n), avgs(n);
      on_group(n, [&](int r, Communicator& c) {
        std::vector<float> a(len), b(len);
        for (std::size_t i = 0; i < len; ++i) a[i] = b[i] = value(r, i);
        c.all_reduce(a.data(), len, ReduceOp::sum);
        c.all_reduce(b.data(), len, ReduceOp::avg);
        sums[r] = std::move(a);
        avgs[r] = std::move(b);
      });
      // One check per rank, not per element: millions of assertions took minutes under TSan.
      std::vector<float> want(len);
      for (std::size_t i = 0; i < len; ++i) want[i] = expected_sum(n, i);
      for (int r = 0; r < n; ++r) {
        REQUIRE(sums[r] == want);
        double worst = 0.0;  // the average's largest relative error
        for (std::size_t i = 0; i < len; ++i) {
          const double exact = static_cast<double>(want[i]) / n;
          const double error = std::abs(avgs[r][i] - exact) / std::max(std::abs(exact), 1e-30);
          worst = test::worse(worst, error);
        }
        REQUIRE(worst <= 1e-6);
        // Every rank holds the same bits, whatever the rounding of the average.
        REQUIRE(avgs[r] == avgs[0]);
      }
    }
  }
}

// Values whose sums round: the order of the additions shows in the bits.
TEST_CASE("all_reduce gives the bits of the rank-order sum, whatever the rounding") {
  for (int n : {2, 3, 4, 5}) {
    // Lengths cut into slices that cross the reduction's 4096-element chunks unevenly.
    for (std::size_t len : {std::size_t{7}, std::size_t{4096} * n + 5, std::size_t{50001}}) {
      CAPTURE(n);
      CAPTURE(len);
      auto input = [](int r, std::size_t i) {
        return 1.0f / static_cast<float>(3 + r + i % 11) + 1e-3f * static_cast<float>(i % 5);
      };
      std::vector<float> sum(len), avg(len);
      for (std::size_t i = 0; i < len; ++i) {
        float acc = input(0, i);
        for (int r = 1; r < n; ++r) acc += input(r, i);
        sum[i] = acc;
        avg[i] = acc * (1.0f / static_cast<float>(n));
      }
      std::vector<std::vector<float>> sums(n), avgs(n);
      on_group(n, [&](int r, Communicator& c) {
        std::vector<float> a(len), b(len);
        for (std::size_t i = 0; i < len; ++i) a[i] = b[i] = input(r, i);
        c.all_reduce(a.data(), len, ReduceOp::sum);
        c.all_reduce_async(b.data(), len, ReduceOp::avg)->wait();
        sums[r] = std::move(a);
        avgs[r] = std::move(b);
      });
      for (int r = 0; r < n; ++r) {
        CHECK(sums[r] == sum);
        CHECK(avgs[r] == avg);
      }
    }
  }
}

TEST_CASE("broadcast copies the root's buffer to every rank") {
  for (int n = 1; n <= 5; ++n) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<float>> out(n);
      on_group(n, [&](int r, Communicator& c) {
        std::vector<float> a(37, static_cast<float>(r));
        c.broadcast(a.data(), a.size(), root);
        out[r] = a;
      });
      for (int r = 0; r < n; ++r) CHECK(out[r] == std::vector<float>(37, static_cast<float>(root)));
    }
  }
}

TEST_CASE("host collectives: sum of doubles and all-gather") {
  const int n = 6;
  std::vector<std::vector<double>> sums(n);
  std::vector<std::vector<std::uint64_t>> gathered(n);
  on_group(n, [&](int r, Communicator& c) {
    std::vector<double> v{1.0, static_cast<double>(r), 0.5 * r};
    c.all_reduce_host(v);
    sums[r] = v;
    gathered[r] = c.all_gather_host(100u + static_cast<std::uint64_t>(r));
    c.barrier();
  });
  for (int r = 0; r < n; ++r) {
    CHECK(sums[r] == std::vector<double>{6.0, 15.0, 7.5});
    CHECK(gathered[r] == std::vector<std::uint64_t>{100, 101, 102, 103, 104, 105});
  }
}

TEST_CASE("a rank that aborts releases every other rank from the collective") {
  for (int n = 2; n <= 6; ++n) {
    const int failing = n - 1;
    std::vector<int> aborted(n, 0);
    on_group(n, [&](int r, Communicator& c) {
      std::vector<float> a(1000, 1.0f);
      try {
        for (int step = 0; step < 5; ++step) {
          if (r == failing && step == 2) throw std::runtime_error("injected");
          c.all_reduce(a.data(), a.size(), ReduceOp::sum);
          c.barrier();
        }
      } catch (const lockstep::CommAborted&) {
        aborted[r] = 1;
        c.abort();
      } catch (const std::runtime_error&) {
        c.abort();
      }
    });
    for (int r = 0; r < n; ++r)
      if (r != failing) CHECK(aborted[r] == 1);
  }
}

// Note [A completed phase stands]: a rank that aborts right after a phase that every rank
// joined must not take it back from a peer still asleep in it: the peer returns. (Before, the
// peer threw CommAborted when it woke after the abort, and whether it did depended on the
// scheduler: the survivors of a lost device then held different states, Note [Shrink] in
// src/train/recovery.hpp.) Both planes' barriers are the same kind; the control plane's is the
// one a test can make a rank sleep in.
TEST_CASE("a phase every rank joined completes on every rank, however late one wakes") {
  for (int round = 0; round < 5; ++round) {
    std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
    bool late_returned = false;
    on_group(2, [&](int r, Communicator& c) {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      c.all_reduce(r == 0 ? a.data() : b.data(), a.size(), ReduceOp::sum);
      if (r == 1) {  // arrives first and sleeps in the barrier
        try {
          c.barrier();
          late_returned = true;
        } catch (const lockstep::CommAborted&) {
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      c.barrier();
      c.abort();  // at once: the peer has not woken from the barrier yet
    });
    CHECK(late_returned);
    CHECK(b == std::vector<float>(1000, 3.0f));
  }
}
