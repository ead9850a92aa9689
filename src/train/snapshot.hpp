// In-memory snapshots of the training state, for a recovery (trainer.snapshot_every).
//
// Note [Snapshots]
//   With trainer.on_worker_failure: shrink and trainer.snapshot_every K, the state a checkpoint
//   of every K-th step would hold (parameters, optimiser state, position) is copied to host
//   memory after that step's barrier, so that a recovery (Note [Shrink] in recovery.hpp) that
//   cannot use the failed step's start goes back at most K steps.
//   - Every worker copies a part. Without ZeRO-1 the replicas are identical and worker r takes
//     the r-th equal slice of the parameter buffer, of the parameters and of each optimiser
//     state vector; with it, the shards its optimiser owns. Each device moves 1/N of the state
//     and no collective is needed: the parts meet in this process's memory, and newest()
//     assembles them into a checkpoint only when a recovery asks.
//   - The copy is a Download (Note [Downloads] in lockstep/device.hpp): on a GPU, pinned memory
//     and a stream of its own, started after the step's kernels and never waited for by the
//     step. The next step's forward and backward, which only read the parameters, run while it
//     copies; the first writer, that step's optimiser update, is ordered after it on the device
//     (Download::fence, at the top of WorkerLoop::reduce_and_update). On the CPU the copy is a
//     memcpy on the step's thread.
//   - Two buffers: the newest complete snapshot, and the one being written. A worker learns
//     that its copy has landed by polling, before each step's barrier (part_done); the last
//     part to land makes that snapshot the newest, and only then is the older one given up. So
//     a failure during a copy leaves the previous snapshot, and the parts of an incomplete one
//     (a lost device's among them) are never used.
//   - Before a worker writes the next snapshot into the older buffer, the one being written
//     must be complete: in a step that takes a snapshot every worker waits for its own part of
//     the previous one (K steps old, long landed) before that step's barrier, so after the
//     barrier it is complete on every worker.
//   The host memory, two snapshots' worth (MemoryPlan::snapshots), is allocated once per part
//   and buffer through Device::allocate_host, pinned on a GPU, and belongs to the slot: it
//   outlives the workers and devices of a failed group, which a recovery needs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/device.hpp"

namespace lockstep::detail {

// A run [begin, end) of the parameter buffer that one worker copies, and where that run starts
// in its optimiser's state vectors (equal to begin without ZeRO-1).
struct SnapshotRange {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t state_at = 0;
  std::size_t size() const noexcept { return end - begin; }
};

// The two snapshot buffers of a run, shared by its workers (and the groups after a shrink).
// Thread-safe.
class SnapshotSlot {
 public:
  using Allocate = std::function<HostMemory(std::size_t bytes)>;

  // The floats a part of `ranges` takes with `vectors` optimiser state vectors: the parameters
  // of each range, one after another, then each state vector's likewise.
  static std::size_t part_floats(const std::vector<SnapshotRange>& ranges, std::size_t vectors);

  // On the host thread, before a group of `workers` starts: each snapshot has that many parts.
  // A snapshot that is not complete (a failed group's) is dropped; the newest is kept.
  void start_group(int workers);
  // Worker `rank`, before its group's first step: memory for its part in each buffer that the
  // newest snapshot does not occupy, so that the first snapshots allocate nothing.
  void reserve(int rank, std::size_t floats, const Allocate& allocate);
  // Worker `rank`, after step `step`'s barrier: where its part of that step's snapshot goes,
  // `part_floats(ranges, vectors)` floats, to be filled by a copy started now. The buffer the
  // newest snapshot does not occupy is taken, and its previous contents given up. `skeleton`
  // (exactly one worker of the group gives it): the step's checkpoint without parameters and
  // with the optimiser state vectors named but empty.
  float* begin_part(int rank, std::int64_t step, std::vector<SnapshotRange> ranges,
                    std::size_t vectors, const Allocate& allocate,
                    std::optional<Checkpoint> skeleton);
  // Worker `rank`'s copy for step `step` has landed; the last part makes the snapshot newest.
  void part_done(int rank, std::int64_t step);
  // The newest complete snapshot as a checkpoint (the parts assembled); nullopt if none.
  std::optional<Checkpoint> newest() const;

 private:
  struct Part {
    HostMemory memory;
    std::size_t capacity = 0;  // floats
    std::vector<SnapshotRange> ranges;
    bool begun = false;
    bool done = false;
  };
  struct Buffer {
    std::int64_t step = -1;  // -1: holds nothing
    std::optional<Checkpoint> skeleton;
    std::vector<Part> parts;
    bool complete = false;
  };
  static void ensure(Part& part, std::size_t floats, const Allocate& allocate);
  void clear(Buffer& b, std::int64_t step) const;
  Buffer& writing() noexcept { return buffers_[newest_ == 0 ? 1 : 0]; }

  mutable std::mutex mutex_;
  std::array<Buffer, 2> buffers_;
  int newest_ = -1;  // index into buffers_ of the newest complete snapshot, or -1
  int workers_ = 0;
};

}  // namespace lockstep::detail
