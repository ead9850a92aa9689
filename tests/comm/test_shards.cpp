// Shards, reduce-scatter and all-gather of the shared-memory communicator against closed-form
// expectations: rank r fills element i with value(r, i); the owner of each shard must end with
// the exact sum, and every rank with every owner's shard.
#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "comm/closed_form.hpp"
#include "lockstep/comm.hpp"

using lockstep::Communicator;
using lockstep::ReduceOp;
using lockstep::shard_range;
using lockstep::ShardRange;
using lockstep::test::expected_sum;
using lockstep::test::on_group;
using lockstep::test::value;

namespace {

// The lengths every case runs: empty, fewer than the ranks, odd, and larger than a chunk of the
// reduction (4096) many times over.
std::vector<std::size_t> lengths(int n) {
  const std::size_t n_sz = static_cast<std::size_t>(n);
  return {0, 1, n_sz - 1, n_sz + 1, 3 * n_sz, 4101, (std::size_t{1} << 15) + 13};
}

// The rank whose shard holds element i.
int owner(std::size_t count, int n, std::size_t grain, std::size_t i) {
  for (int r = 0; r < n; ++r)
    if (i < shard_range(count, n, r, grain).end) return r;
  return -1;
}

}  // namespace

TEST_CASE("shard_range: contiguous whole grains in rank order, the first ranks one grain more") {
  auto shards = [](std::size_t count, int n, std::size_t grain) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (int r = 0; r < n; ++r) {
      const ShardRange s = shard_range(count, n, r, grain);
      out.emplace_back(s.begin, s.end);
    }
    return out;
  };
  using V = std::vector<std::pair<std::size_t, std::size_t>>;
  CHECK(shards(10, 4, 1) == V{{0, 3}, {3, 6}, {6, 8}, {8, 10}});
  CHECK(shards(10, 4, 3) == V{{0, 3}, {3, 6}, {6, 9}, {9, 10}});
  CHECK(shards(5, 4, 4) == V{{0, 4}, {4, 5}, {5, 5}, {5, 5}});
  CHECK(shards(0, 3, 2) == V{{0, 0}, {0, 0}, {0, 0}});
  CHECK(shards(7, 1, 2) == V{{0, 7}});
  for (int n = 1; n <= 8; ++n)
    for (std::size_t grain : {1, 2, 7})
      for (std::size_t count : lengths(n)) {
        std::size_t at = 0, most = 0, least = ~std::size_t{0};
        for (int r = 0; r < n; ++r) {
          const ShardRange s = shard_range(count, n, r, grain);
          REQUIRE(s.begin == at);
          REQUIRE((s.begin % grain == 0 || s.begin == count));
          const std::size_t grains = (s.size() + grain - 1) / grain;
          most = std::max(most, grains);
          least = std::min(least, grains);
          at = s.end;
        }
        REQUIRE(at == count);
        REQUIRE(most - least <= 1);
      }
}

// The first i in [begin, end) where got[i] != want(i), or `end`: one assertion per range rather
// than per element (millions of them took minutes under TSan).
template <class Want>
std::size_t first_mismatch(const std::vector<float>& got, std::size_t begin, std::size_t end,
                           Want want) {
  for (std::size_t i = begin; i < end; ++i)
    if (got[i] != want(i)) return i;
  return end;
}

TEST_CASE("reduce_scatter: the owner's shard holds the exact sum, the all-reduce's bits") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t grain : {1, 5})
      for (std::size_t len : lengths(n)) {
        CAPTURE(n);
        CAPTURE(grain);
        CAPTURE(len);
        std::vector<std::vector<float>> sums(n), avgs(n), async(n), reference(n);
        on_group(n, [&](int r, Communicator& c) {
          std::vector<float> a(len), b(len), d(len), e(len);
          for (std::size_t i = 0; i < len; ++i) a[i] = b[i] = d[i] = e[i] = value(r, i);
          c.reduce_scatter(a.data(), len, grain, ReduceOp::sum);
          c.reduce_scatter(b.data(), len, grain, ReduceOp::avg);
          // Two in flight at once on the communication thread, as the ZeRO reducer starts them.
          const std::size_t half = len / 2;
          auto first = c.reduce_scatter_async(d.data(), half, grain, ReduceOp::avg);
          auto second = c.reduce_scatter_async(d.data() + half, len - half, grain, ReduceOp::avg);
          first->wait();
          second->wait();
          c.all_reduce(e.data(), len, ReduceOp::avg);
          sums[r] = std::move(a);
          avgs[r] = std::move(b);
          async[r] = std::move(d);
          reference[r] = std::move(e);
        });
        const std::size_t half = len / 2;
        for (int r = 0; r < n; ++r) {
          CAPTURE(r);
          const auto sum = [n](std::size_t i) { return expected_sum(n, i); };
          const auto all_reduced = [&](std::size_t i) { return reference[0][i]; };
          const ShardRange s = shard_range(len, n, r, grain);
          REQUIRE(first_mismatch(sums[r], s.begin, s.end, sum) == s.end);
          REQUIRE(first_mismatch(avgs[r], s.begin, s.end, all_reduced) == s.end);
          const ShardRange lo = shard_range(half, n, r, grain);
          const ShardRange hi = shard_range(len - half, n, r, grain);
          REQUIRE(first_mismatch(async[r], lo.begin, lo.end, all_reduced) == lo.end);
          REQUIRE(first_mismatch(async[r], half + hi.begin, half + hi.end, all_reduced) ==
                  half + hi.end);
        }
      }
}

TEST_CASE("all_gather: every rank gets every shard, and after reduce_scatter it is the all-reduce") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t grain : {1, 3})
      for (std::size_t len : lengths(n)) {
        CAPTURE(n);
        CAPTURE(grain);
        CAPTURE(len);
        std::vector<std::vector<float>> gathered(n), both(n), reference(n);
        on_group(n, [&](int r, Communicator& c) {
          const ShardRange s = shard_range(len, n, r, grain);
          std::vector<float> a(len, -1.0f), b(len), e(len);
          for (std::size_t i = s.begin; i < s.end; ++i) a[i] = value(r, i);
          for (std::size_t i = 0; i < len; ++i) b[i] = e[i] = value(r, i);
          c.all_gather_async(a.data(), len, grain)->wait();
          c.reduce_scatter(b.data(), len, grain, ReduceOp::avg);
          c.all_gather(b.data(), len, grain);
          c.all_reduce(e.data(), len, ReduceOp::avg);
          gathered[r] = std::move(a);
          both[r] = std::move(b);
          reference[r] = std::move(e);
        });
        for (int r = 0; r < n; ++r) {
          CAPTURE(r);
          REQUIRE(first_mismatch(gathered[r], 0, len, [&](std::size_t i) {
                    return value(owner(len, n, grain, i), i);
                  }) == len);
          REQUIRE(both[r] == reference[r]);
          REQUIRE(both[r] == both[0]);
        }
      }
}
