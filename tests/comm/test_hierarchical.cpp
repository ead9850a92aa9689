// The hierarchical communicator (shared memory within a process, a ProcessGroup across) against
// closed-form expectations, with P fake processes of L workers each in this test process (see
// loopback_processes.hpp). Global rank g = p * L + l fills its buffer from g and the index.
#include <doctest/doctest.h>

#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/loopback_processes.hpp"
#include "comm/closed_form.hpp"
#include "lockstep/comm.hpp"

using lockstep::Communicator;
using lockstep::ReduceOp;

namespace {

// Runs fn(global rank, comm) on one thread per worker of P processes x L workers.
template <class Fn>
void on_job(int processes, int local, Fn fn) {
  auto group = lockstep::test::make_loopback_processes(processes);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int p = 0; p < processes; ++p)
    for (auto& c : lockstep::make_hierarchical_group(lockstep::make_shared_memory_group(local), group[p]))
      comms.push_back(std::move(c));
  std::vector<std::thread> threads;
  for (int g = 0; g < processes * local; ++g) threads.emplace_back([&, g] { fn(g, *comms[g]); });
  for (auto& t : threads) t.join();
}

// Runs fn(processes, local, len) for every job shape and buffer length the cases cover.
template <class Fn>
void for_each_shape(Fn fn) {
  for (int processes = 1; processes <= 3; ++processes)
    for (int local = 1; local <= 3; ++local)
      for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4101}}) {
        CAPTURE(processes);
        CAPTURE(local);
        CAPTURE(len);
        fn(processes, local, len);
      }
}

using lockstep::test::expected_sum;
using lockstep::test::value;

}  // namespace

TEST_CASE("hierarchical all_reduce: exact sums, identical averages, sync and async, P x L") {
  for_each_shape([](int processes, int local, std::size_t len) {
    const int n = processes * local;
    std::vector<std::vector<float>> sums(n), avgs(n), async(n);
    std::vector<int> ranks(n, -1), sizes(n, -1);
    on_job(processes, local, [&](int g, Communicator& c) {
      ranks[g] = c.rank();
      sizes[g] = c.size();
      std::vector<float> a(len), b(len), d(len);
      for (std::size_t i = 0; i < len; ++i) a[i] = b[i] = d[i] = value(g, i);
      c.all_reduce(a.data(), len, ReduceOp::sum);
      c.all_reduce(b.data(), len, ReduceOp::avg);
      // Two in flight at once, on the communication thread, as the reducer does.
      const std::size_t half = len / 2;
      auto first = c.all_reduce_async(d.data(), half, ReduceOp::sum);
      auto second = c.all_reduce_async(d.data() + half, len - half, ReduceOp::sum);
      first->wait();
      second->wait();
      sums[g] = std::move(a);
      avgs[g] = std::move(b);
      async[g] = std::move(d);
    });
    for (int g = 0; g < n; ++g) {
      REQUIRE(ranks[g] == g);
      REQUIRE(sizes[g] == n);
      for (std::size_t i = 0; i < len; ++i) {
        REQUIRE(sums[g][i] == expected_sum(n, i));
        REQUIRE(avgs[g][i] == doctest::Approx(expected_sum(n, i) / n).epsilon(1e-6));
      }
      REQUIRE(async[g] == sums[g]);
      REQUIRE(avgs[g] == avgs[0]);  // the same bits in every process
    }
  });
}

TEST_CASE("hierarchical reduce_scatter and all_gather: exact shards across processes, P x L") {
  for_each_shape([](int processes, int local, std::size_t len) {
    const int n = processes * local;
    std::vector<std::vector<float>> sums(n), gathered(n), both(n), reference(n);
    on_job(processes, local, [&](int g, Communicator& c) {
      const lockstep::ShardRange s = lockstep::shard_range(len, n, g, 2);
      std::vector<float> a(len), b(len, -1.0f), d(len), e(len);
      for (std::size_t i = 0; i < len; ++i) a[i] = d[i] = e[i] = value(g, i);
      for (std::size_t i = s.begin; i < s.end; ++i) b[i] = value(g, i);
      c.reduce_scatter_async(a.data(), len, 2, ReduceOp::sum)->wait();
      c.all_gather_async(b.data(), len, 2)->wait();
      c.reduce_scatter(d.data(), len, 2, ReduceOp::avg);
      c.all_gather(d.data(), len, 2);
      c.all_reduce(e.data(), len, ReduceOp::avg);
      sums[g] = std::move(a);
      gathered[g] = std::move(b);
      both[g] = std::move(d);
      reference[g] = std::move(e);
    });
    for (int g = 0; g < n; ++g) {
      const lockstep::ShardRange s = lockstep::shard_range(len, n, g, 2);
      for (std::size_t i = s.begin; i < s.end; ++i) REQUIRE(sums[g][i] == expected_sum(n, i));
      for (int owner = 0; owner < n; ++owner) {
        const lockstep::ShardRange o = lockstep::shard_range(len, n, owner, 2);
        for (std::size_t i = o.begin; i < o.end; ++i)
          REQUIRE(gathered[g][i] == value(owner, i));
      }
      REQUIRE(both[g] == reference[g]);
      REQUIRE(both[g] == both[0]);
    }
  });
}

TEST_CASE("hierarchical broadcast copies the root's buffer to every rank of every process") {
  const int processes = 2, local = 3, n = processes * local;
  for (int root = 0; root < n; ++root) {
    std::vector<std::vector<float>> out(n);
    on_job(processes, local, [&](int g, Communicator& c) {
      std::vector<float> a(37, static_cast<float>(g));
      c.broadcast(a.data(), a.size(), root);
      out[g] = a;
    });
    for (int g = 0; g < n; ++g) CHECK(out[g] == std::vector<float>(37, static_cast<float>(root)));
  }
}

TEST_CASE("hierarchical host collectives: sums and an all-gather in global rank order") {
  const int processes = 3, local = 2, n = processes * local;
  std::vector<std::vector<double>> sums(n);
  std::vector<std::vector<std::uint64_t>> gathered(n);
  on_job(processes, local, [&](int g, Communicator& c) {
    std::vector<double> v{1.0, static_cast<double>(g), 0.5 * g};
    c.all_reduce_host(v);
    sums[g] = v;
    gathered[g] = c.all_gather_host(100u + static_cast<std::uint64_t>(g));
    c.barrier();
  });
  for (int g = 0; g < n; ++g) {
    CHECK(sums[g] == std::vector<double>{6.0, 15.0, 7.5});
    CHECK(gathered[g] == std::vector<std::uint64_t>{100, 101, 102, 103, 104, 105});
  }
}

TEST_CASE("a worker that fails in one process releases every worker of every process") {
  const int processes = 2, local = 2, n = processes * local, failing = 3;
  std::vector<int> released(n, 0);
  on_job(processes, local, [&](int g, Communicator& c) {
    std::vector<float> a(1000, 1.0f);
    try {
      for (int step = 0; step < 5; ++step) {
        if (g == failing && step == 2) throw std::runtime_error("injected");
        c.all_reduce_async(a.data(), a.size(), ReduceOp::sum)->wait();
        c.barrier();
      }
    } catch (const lockstep::CommAborted&) {
      released[g] = 1;
      c.abort();
    } catch (const std::runtime_error&) {
      c.abort();
    }
  });
  for (int g = 0; g < n; ++g)
    if (g != failing) CHECK(released[g] == 1);
}
