// The snapshot slot (Note [Snapshots] in src/train/snapshot.hpp): parts meet into one
// checkpoint, a snapshot replaces the older one only once every part has landed, a failed
// group's incomplete one is dropped, and memory is allocated once per part and buffer. The
// trainer's use of it is tested through recoveries (test_shrink.cpp) and host syncs
// (test_step_record.cpp).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/lockstep.hpp"
#include "train/snapshot.hpp"

using namespace lockstep;
using lockstep::detail::SnapshotRange;
using lockstep::detail::SnapshotSlot;

namespace {

// Counts the allocations a slot makes.
struct Allocations {
  int count = 0;
  SnapshotSlot::Allocate allocate() {
    return [this](std::size_t bytes) {
      ++count;
      return HostMemory(new std::byte[bytes]);
    };
  }
};

Checkpoint skeleton(std::int64_t step) {
  Checkpoint c;
  c.state.step = step;
  c.optimizer_state = {{"adamw.m", {}}, {"adamw.v", {}}};
  return c;
}

// What worker `rank`'s copy would write for step `step`: its part laid out as part_floats()
// says, element i of the buffer holding 1000 * step + i for the parameters, and that plus
// 100000 * (k + 1) for state vector k. `state_at` is where the range starts in the worker's
// own state (ZeRO-1): the value follows the buffer position, as the real copy's does.
void fill(float* part, const std::vector<SnapshotRange>& ranges, std::int64_t step) {
  const std::size_t elements = SnapshotSlot::part_floats(ranges, 0);
  std::size_t at = 0;
  for (const SnapshotRange& r : ranges) {
    for (std::size_t i = 0; i < r.size(); ++i)
      for (std::size_t k = 0; k < 3; ++k)
        part[k * elements + at + i] = static_cast<float>(1000 * step + r.begin + i + 100000 * k);
    at += r.size();
  }
}

void check_state(const Checkpoint& c, std::int64_t step, std::size_t n) {
  CHECK(c.state.step == step);
  REQUIRE(c.params.size() == n);
  REQUIRE(c.optimizer_state.size() == 2);
  CHECK(c.optimizer_state[0].name == "adamw.m");
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    REQUIRE(c.params[i] == static_cast<float>(1000 * step + i));
    REQUIRE(c.optimizer_state[0].values[i] == static_cast<float>(1000 * step + i + 100000));
    REQUIRE(c.optimizer_state[1].values[i] == static_cast<float>(1000 * step + i + 200000));
  }
}

// Worker `rank` of a group takes its part of step `step`'s snapshot; worker 0 describes it.
void take(SnapshotSlot& slot, Allocations& a, int rank, std::int64_t step,
          const std::vector<SnapshotRange>& ranges) {
  float* part = slot.begin_part(rank, step, ranges, 2, a.allocate(),
                                rank == 0 ? std::optional(skeleton(step)) : std::nullopt);
  fill(part, ranges, step);
}

// Two workers' ranges over 10 elements: ZeRO-1's interleaved shards, in state order.
const std::vector<SnapshotRange> kRanks[] = {{{0, 3, 0}, {6, 8, 3}}, {{3, 6, 0}, {8, 10, 3}}};

}  // namespace

TEST_CASE("snapshot slot: the parts of every worker meet into one checkpoint, once all landed") {
  SnapshotSlot slot;
  Allocations a;
  slot.start_group(2);
  CHECK_FALSE(slot.newest());
  take(slot, a, 0, 3, kRanks[0]);
  take(slot, a, 1, 3, kRanks[1]);
  slot.part_done(1, 3);
  CHECK_FALSE(slot.newest());  // worker 0's copy has not landed
  slot.part_done(0, 3);
  const std::optional<Checkpoint> c = slot.newest();
  REQUIRE(c);
  check_state(*c, 3, 10);
}

TEST_CASE("snapshot slot: the newest is kept while the next is written, and given up after") {
  SnapshotSlot slot;
  Allocations a;
  slot.start_group(2);
  for (int rank : {0, 1}) slot.reserve(rank, SnapshotSlot::part_floats(kRanks[rank], 2), a.allocate());
  CHECK(a.count == 4);  // two parts in each of two buffers
  for (int rank : {0, 1}) take(slot, a, rank, 3, kRanks[rank]);
  for (int rank : {0, 1}) slot.part_done(rank, 3);
  // Step 6's copies, one landed: a failure now finds step 3's snapshot whole, in memory that
  // step 6's copies do not touch.
  for (int rank : {0, 1}) take(slot, a, rank, 6, kRanks[rank]);
  slot.part_done(0, 6);
  check_state(*slot.newest(), 3, 10);
  slot.part_done(1, 6);
  check_state(*slot.newest(), 6, 10);
  // Step 9 goes where step 3 was; step 6's stays whole until step 9's last part lands.
  for (int rank : {0, 1}) take(slot, a, rank, 9, kRanks[rank]);
  slot.part_done(1, 9);
  check_state(*slot.newest(), 6, 10);
  slot.part_done(0, 9);
  check_state(*slot.newest(), 9, 10);
  CHECK(a.count == 4);  // the reserved memory, reused
}

TEST_CASE("snapshot slot: a failed group's incomplete snapshot is dropped, the survivors go on") {
  SnapshotSlot slot;
  Allocations a;
  slot.start_group(2);
  for (int rank : {0, 1}) take(slot, a, rank, 3, kRanks[rank]);
  for (int rank : {0, 1}) slot.part_done(rank, 3);
  // Step 6: worker 1's device is lost before its copy lands.
  for (int rank : {0, 1}) take(slot, a, rank, 6, kRanks[rank]);
  slot.part_done(0, 6);
  slot.start_group(1);  // the survivor's group
  slot.part_done(1, 6);  // a straggler's word about a snapshot given up changes nothing
  check_state(*slot.newest(), 3, 10);
  // The survivor alone copies everything; step 3's snapshot stays until its copy lands.
  const std::vector<SnapshotRange> all = {{0, 10, 0}};
  take(slot, a, 0, 9, all);
  check_state(*slot.newest(), 3, 10);
  slot.part_done(0, 9);
  check_state(*slot.newest(), 9, 10);
}

TEST_CASE("snapshot slot: a worker with nothing to copy still completes its part") {
  SnapshotSlot slot;
  Allocations a;
  slot.start_group(3);
  const std::vector<SnapshotRange> ranks[] = {{{0, 4, 0}}, {{4, 10, 0}}, {}};
  for (int rank : {0, 1, 2}) take(slot, a, rank, 2, ranks[rank]);
  slot.part_done(0, 2);
  slot.part_done(1, 2);
  CHECK_FALSE(slot.newest());
  slot.part_done(2, 2);
  check_state(*slot.newest(), 2, 10);
}

// The CPU device's Download (Note [Downloads]): copied by start(), with no host sync counted, as
// a GPU's queued copy makes none. tests/cuda/test_cuda_download.cpp holds the GPU's.
TEST_CASE("snapshot: the CPU device's download copies at start, and makes no host sync") {
  auto dev = make_cpu_device(0, 1);
  const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  DeviceArray<float> src(*dev, values.size());
  src.upload(values);
  const HostMemory host = dev->allocate_host(values.size() * sizeof(float));
  float* out = reinterpret_cast<float*>(host.get());
  std::unique_ptr<Download> download = dev->make_download();
  const std::uint64_t syncs = dev->host_syncs();
  const Transfer copies[] = {{out + 2, src.data(), 3 * sizeof(float)},
                             {out, src.data() + 3, 2 * sizeof(float)}};
  download->start(copies);
  download->fence();
  CHECK(download->done());
  download->wait();
  CHECK(dev->host_syncs() == syncs);
  CHECK(std::vector<float>(out, out + 5) == std::vector<float>{4.0f, 5.0f, 1.0f, 2.0f, 3.0f});
}
