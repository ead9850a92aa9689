#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <set>
#include <stdexcept>
#include <vector>

#include "lockstep/dataset.hpp"

using lockstep::DistributedSampler;

namespace {

// The global order the ranks split between them: position r + k*N is rank r's k-th index.
std::vector<std::size_t> interleave(std::size_t size, int replicas, bool shuffle,
                                    std::uint64_t seed, std::uint64_t epoch, bool drop_last) {
  std::vector<std::vector<std::size_t>> shards;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(size, replicas, r, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    shards.push_back(s.indices());
    REQUIRE(shards.back().size() == s.num_samples());
    REQUIRE(shards.back().size() == shards.front().size());  // equal-length shards
  }
  std::vector<std::size_t> global;
  for (std::size_t k = 0; k < shards.front().size(); ++k) {
    for (const auto& shard : shards) global.push_back(shard[k]);
  }
  return global;
}

// The whole permutation for (seed, epoch), as a single replica sees it.
std::vector<std::size_t> permutation(std::size_t size, bool shuffle, std::uint64_t seed,
                                     std::uint64_t epoch) {
  DistributedSampler s(size, 1, 0, shuffle, seed, false);
  s.set_epoch(epoch);
  return s.indices();
}

}  // namespace

TEST_CASE("DistributedSampler: shard sizes follow PyTorch") {
  // ceil(size / N), or floor(size / N) with drop_last.
  CHECK(DistributedSampler(10, 3, 0, true, 0, false).num_samples() == 4);
  CHECK(DistributedSampler(10, 3, 0, true, 0, false).total_size() == 12);
  CHECK(DistributedSampler(10, 3, 0, true, 0, true).num_samples() == 3);
  CHECK(DistributedSampler(9, 3, 0, true, 0, true).num_samples() == 3);
  CHECK(DistributedSampler(2, 5, 0, true, 0, true).num_samples() == 0);
  CHECK(DistributedSampler(2, 5, 4, true, 0, false).num_samples() == 1);
  CHECK(DistributedSampler(0, 4, 3, true, 0, false).indices().empty());
  CHECK(DistributedSampler(0, 4, 3, true, 0, true).indices().empty());
}

TEST_CASE("DistributedSampler: unshuffled shards match PyTorch's examples") {
  using V = std::vector<std::size_t>;
  CHECK(DistributedSampler(10, 3, 0, false, 0, false).indices() == V{0, 3, 6, 9});
  CHECK(DistributedSampler(10, 3, 1, false, 0, false).indices() == V{1, 4, 7, 0});
  CHECK(DistributedSampler(10, 3, 2, false, 0, false).indices() == V{2, 5, 8, 1});
  CHECK(DistributedSampler(10, 3, 2, false, 0, true).indices() == V{2, 5, 8});
  // Padding longer than the data repeats it again and again.
  CHECK(DistributedSampler(2, 5, 4, false, 0, false).indices() == V{0});
  CHECK(DistributedSampler(3, 4, 0, false, 0, false).indices() == V{0});
  CHECK(DistributedSampler(3, 4, 3, false, 0, false).indices() == V{0});
  CHECK(DistributedSampler(1, 3, 2, false, 0, false).indices() == V{0});
}

TEST_CASE("DistributedSampler: shards are complete, equal and share one permutation") {
  for (const std::size_t size : {0, 1, 2, 5, 7, 8, 16, 17, 23, 64, 101}) {
    for (int n = 1; n <= 8; ++n) {
      for (const bool drop_last : {false, true}) {
        for (const bool shuffle : {false, true}) {
          CAPTURE(size);
          CAPTURE(n);
          CAPTURE(drop_last);
          CAPTURE(shuffle);
          const auto global = interleave(size, n, shuffle, 42, 3, drop_last);
          const auto perm = permutation(size, shuffle, 42, 3);
          const std::size_t total = drop_last ? size / n * n : (size + n - 1) / n * n;
          REQUIRE(global.size() == total);
          REQUIRE(perm.size() == size);
          REQUIRE(std::set<std::size_t>(perm.begin(), perm.end()).size() == size);

          // The permutation, then its prefix again (wrap-around padding) or cut short.
          for (std::size_t p = 0; p < total; ++p) REQUIRE(global[p] == perm[p % size]);
          const std::set<std::size_t> distinct(global.begin(), global.end());
          if (!drop_last) CHECK(distinct.size() == size);              // every sample is seen
          if (size % n == 0) CHECK(distinct.size() == global.size());  // disjoint shards
          if (!shuffle) {
            for (std::size_t p = 0; p < total; ++p) REQUIRE(global[p] == p % size);
          }
        }
      }
    }
  }
}

TEST_CASE("DistributedSampler: the order depends on seed and epoch only") {
  DistributedSampler a(100, 4, 1, true, 7, false);
  DistributedSampler b(100, 4, 1, true, 7, false);
  CHECK(a.indices() == b.indices());
  CHECK(a.epoch() == 0);

  const auto epoch0 = a.indices();
  a.set_epoch(1);
  CHECK(a.epoch() == 1);
  CHECK(a.indices() != epoch0);
  b.set_epoch(1);
  CHECK(a.indices() == b.indices());

  CHECK(permutation(100, true, 7, 0) != permutation(100, true, 8, 0));
  CHECK(permutation(100, true, 7, 5) != permutation(100, true, 7, 6));
}

TEST_CASE("DistributedSampler: rejects bad replica arguments") {
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0, true, 0, false), std::invalid_argument);
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2, true, 0, false), std::invalid_argument);
  CHECK_THROWS_AS(DistributedSampler(10, 2, -1, true, 0, false), std::invalid_argument);
}

TEST_CASE("DistributedSampler: start_at begins one epoch at a position, the next whole") {
  using V = std::vector<std::size_t>;
  // 10 samples, unshuffled: from position 4 on 3 ranks, positions 4..9 and the padding (10, 11
  // wrap to 0, 1): rank r takes 4 + r, 7 + r.
  DistributedSampler r0(10, 3, 0, false, 0, false), r2(10, 3, 2, false, 0, false);
  r0.start_at(2, 4);
  r2.start_at(2, 4);
  r0.set_epoch(2);
  r2.set_epoch(2);
  CHECK(r0.start() == 4);
  CHECK(r0.num_samples() == 2);
  CHECK(r0.whole_epoch_samples() == 4);
  CHECK(r0.indices() == V{4, 7});
  CHECK(r2.indices() == V{6, 9});
  // The other epochs are whole.
  r0.set_epoch(3);
  CHECK(r0.start() == 0);
  CHECK(r0.indices() == V{0, 3, 6, 9});
  r0.set_epoch(1);
  CHECK(r0.num_samples() == 4);
  // drop_last trims the rest: 5 left on 3 ranks, 1 each.
  DistributedSampler d1(10, 3, 1, false, 0, true);
  d1.start_at(0, 5);
  CHECK(d1.indices() == V{6});
  // Shuffled: the same positions of the epoch's permutation.
  const std::vector<std::size_t> perm = permutation(23, true, 7, 0);
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(23, 4, r, true, 7, false);
    s.start_at(0, 9);
    const std::vector<std::size_t> mine = s.indices();
    REQUIRE(mine.size() == 4);  // ceil(14 / 4)
    for (std::size_t k = 0; k < mine.size(); ++k)
      CHECK(mine[k] == perm[(9 + static_cast<std::size_t>(r) + 4 * k) % 23]);
  }
  // The whole epoch at its end, and past it.
  DistributedSampler all(10, 2, 0, false, 0, false);
  all.start_at(0, 10);
  CHECK(all.num_samples() == 0);
  CHECK_THROWS_AS(all.start_at(0, 11), std::invalid_argument);
}
