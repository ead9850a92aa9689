// The gradient reducer: buckets, and all-reduce overlapped with backward.
//
// Note [Buckets]
//   The gradient buffer is laid out in reverse order of the forward pass (see model.hpp), so
//   the layers backward finishes first sit at the front. A bucket is a contiguous run of whole
//   layers' gradients, cut in that order: the first bucket holds at most 1 MB, or the cap if
//   smaller (so the first all-reduce starts early, as in DDP), later ones at most trainer.bucket_cap_mb. A layer
//   larger than the cap gets a bucket of its own. Buckets are views into the gradient buffer:
//   nothing is copied in or out, and the 1/N scaling happens once, inside the all-reduce (avg).
//
//   When backward reports a layer's gradients final, its bucket's count of pending layers drops;
//   at zero the bucket's all-reduce starts at once (all_reduce_async), while backward goes on
//   with earlier layers. Buckets complete in the same order on every rank because backward runs
//   the layers in the same order, so every rank issues the same collectives in the same order.
//   With overlap off, every bucket starts after backward.
//
// Note [bf16 gradient reduction]
//   With trainer.grad_reduce_dtype: bf16 (PyTorch DDP's bf16_compress_hook) each bucket is
//   rounded to bf16 (Device::to_bf16, to nearest even) into a wire buffer of the reducer's,
//   all-reduced (avg) as bf16 (Communicator::all_reduce_bf16: NCCL moves ncclBfloat16; the CPU's
//   communicators sum the widened values in fp32 and round the average once), and widened back
//   into the gradient when wait() returns it. Every rank gets the same bits, so replicas stay
//   identical; the gradient carries bf16's 8 significant bits. The bytes handed to the
//   collective halve (Summary::reduce_bytes_per_step); on the CPU the shared-memory group still
//   moves the widened floats between workers, so there the saving is on paper only. DDP divides
//   by N in bf16 before its sum; here the average is taken in fp32, then rounded. Not with
//   ZeRO-1 yet (the config refuses it).
//
// Note [ZeRO-1]
//   With trainer.zero: 1 each rank keeps the optimiser state of, and updates, only its shards:
//   in every bucket, the contiguous range shard_range(bucket size, N, rank, kZeroGrain) of the
//   bucket (lockstep/comm.hpp): the bucket is cut from its start into grains of kZeroGrain
//   elements, and each rank takes a run of whole grains, the first ranks one grain more. Any
//   parameter count and any N work without padding, since the collectives take uneven shards;
//   a rank holds at most one grain per bucket more than another, and a bucket with fewer grains
//   than ranks leaves the last ranks without a shard of it. Per step:
//     1. each bucket is reduce-scattered (avg) as soon as backward fills it, instead of
//        all-reduced: the rank's shard of the averaged gradient has the all-reduce's bits;
//     2. each rank sums the squares of its grains, one sum per grain
//        (Device::sum_squares_grains, into the step record on the device, Note [One read per
//        step] in step_record.hpp), and an all-gather of bucket i's grain sums gives every rank
//        every grain's sum of it, on the device: the sums of a bucket's grains split among the
//        ranks as its grains do, so they are gathered as floats in pairs (a double's bits,
//        moved, not added). Device::step_control then adds them up in grain order, as without
//        ZeRO, where a rank sums every grain itself: the global norm for clipping and
//        on_nonfinite has the same bits with zero 0 and 1 and any N, and nothing is read on the
//        host mid-step (before, one host all-reduce of the sums did this, a second host sync
//        per step that drained a GPU before its update);
//     3. the optimiser updates the rank's shards (per bucket as each lands when nothing waits
//        for the norm, else after it), with its 1/N of the state;
//     4. each bucket's all-gather starts as soon as its shard is updated; the step waits for
//        them before it ends, so every replica is bit-identical again for the replica check and
//        the next forward. Leaving them in flight instead, issued in forward order, with the
//        next forward waiting before each layer for its bucket's gather (and eval, the replica
//        check and checkpoints waiting for all), was built and measured against this on the
//        CPU: no faster anywhere, 7% slower for gpt_tiny at N = 2 (bench/RESULTS.md, "ZeRO-1
//        all-gathers"), so the simpler end-of-step wait stays.
//   Every element gets the replicated update's arithmetic with the same norm, so a zero 1 run
//   ends bit-identical to zero 0 on the CPU. Checkpoints hold the whole state (gathered, see
//   WorkerLoop::gather_optimizer_state).
//
// Note [ZeRO-2]
//   With trainer.zero: 2 the gradients are sharded as well: a worker holds its shards of the
//   averaged gradient (the ranges ZeRO-1 updates, one after another, as the optimiser's state)
//   and the buffers of the buckets in flight, not the whole gradient buffer. Backward asks the
//   reducer where each layer's gradients go (GradientTarget in lockstep/model.hpp); the first
//   layer to write into a bucket opens it: its buffer is zeroed, as zero_grads() zeroes the
//   whole buffer, and the layers accumulate into it at their offsets in the bucket. Once the
//   bucket is full it is reduce-scattered in place, as under ZeRO-1, and when it is waited for
//   the rank's shard is copied out into the shard buffer; its buffer is then free.
//   Where each bucket's buffer lies is planned once (plan_gradient_slots), by walking backward's
//   layer order:
//     - a bucket opened before the bucket ahead of it is full (GPT's token embedding: the tied
//       LM head writes into it first, the embedding last) is held: a buffer of its own;
//     - the others rotate through two buffers, the even ones' and the odd ones', each as large
//       as the largest bucket it takes: opening the k-th retires the (k-2)-th first (waits for its reduce-scatter, copies its shard out, starting
//       it first where the buckets were not started as they filled: overlap off, or inline).
//   Each bucket sits in its buffer at its offset in the gradient buffer modulo 16 floats, so
//   every kernel writes the same addresses modulo 64 bytes as into the whole buffer. Every
//   element is then the same sum in the same order as under zero 0 and 1 (a bucket is zeroed
//   and accumulated into just as the buffer was; the reduce-scatter gives the all-reduce's
//   bits; the copy moves bits), the norm's grain sums read the same shard, and the optimiser
//   updates it with the same arithmetic: a zero 2 run ends bit-identical to zero 0 and 1.
//   A worker's gradient bytes are its shards (1/N of the buffer, up to a grain per bucket) plus
//   the held buckets and the two rotating buffers (MemoryPlan::gradients): a saving where the
//   largest buckets are a small part of the model (trainer.bucket_cap_mb well below it); a
//   model of two or three buckets holds more than the whole buffer would.
//   With trainer.accumulate_steps > 1 the micro-batches' gradients are summed on each worker
//   before the one reduction, as under zero 0 and 1; reduce-scattering every micro-batch into
//   the shard instead would sum over workers before summing over micro-batches, a different
//   rounding, so it could not be bit-identical. Zero 2 with accumulation therefore keeps the
//   whole gradient buffer (its gradients are those of zero 1), and the plan says so.
//   CUDA graphs are not captured under zero 2 (a retirement waits on the communication stream
//   mid-backward); the run falls back to launching kernels, as trainer.cuda_graphs off.

// Note [Inline collectives]
//   On the CPU a rank's collectives normally run on its communication thread, so that an all-reduce
//   overlaps the rest of backward. That thread is one more runnable thread per worker: when the
//   workers' compute threads already take every core (workers x threads >= cores), it runs only by
//   taking a time slice from compute (which it asks to get at once: Note [A short time slice for
//   the communication thread] in src/comm/comm_thread.hpp), and when overlap cannot help (one
//   bucket: nothing is left to compute while it reduces) the handoff to it and back is pure cost,
//   as it is for a group of one rank, whose collectives do nothing. choose_comm_mode() then runs
//   the collectives inline, on the worker's own thread (the same calls, the same bits; only the
//   thread differs), every bucket after backward (launch_remaining), when the worker has told the
//   watchdog that its compute for the step is done: a worker blocked in an inline all-reduce is
//   waiting for its peers, not stalled. With several buckets and overlap off the thread still helps
//   (a bucket's update overlaps the next bucket's reduction): on an emulated link at N = 2, inline
//   ran 17-18 steps/s, async 20-23. bench/RESULTS.md has the measurements behind the rule; the
//   summary's comm_mode says which mode ran, and LOCKSTEP_COMM_MODE=async|inline overrides the
//   rule, to measure both.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "lockstep/comm.hpp"
#include "lockstep/device.hpp"
#include "lockstep/model.hpp"
#include "train/trace.hpp"

namespace lockstep::detail {

struct Bucket {
  std::size_t begin = 0;  // elements, into the gradient buffer
  std::size_t end = 0;
  std::vector<std::size_t> layers;  // indices into Model::layers(), in backward order
  std::size_t bytes() const noexcept { return (end - begin) * sizeof(float); }
};

// The grain of ZeRO-1's shards and of the gradient norm's terms, elements (Note [ZeRO-1]):
// 64 KiB of floats.
constexpr std::size_t kZeroGrain = 16384;

// Cuts the model's parameters into buckets (see Note [Buckets]). Layers without parameters
// belong to no bucket.
std::vector<Bucket> plan_buckets(const Model& model, double cap_mb, double first_cap_mb = 1.0);

// Where ZeRO-2 keeps each bucket while backward fills it (Note [ZeRO-2]).
struct GradientSlots {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> at;       // per bucket: floats from the arena's start to its begin
  std::vector<std::size_t> retires;  // per bucket: the bucket to retire before it opens, or kNone
  std::size_t floats = 0;            // the arena
  std::size_t held = 0;              // buckets with a buffer of their own
};
GradientSlots plan_gradient_slots(const Model& model, const std::vector<Bucket>& buckets);

// Where a rank's collectives run (Note [Inline collectives]).
enum class CommMode {
  async,   // started with the *_async calls: the communication thread (CPU) or a stream (GPU)
  inline_  // the blocking calls, on the worker's thread
};
const char* to_string(CommMode mode) noexcept;

// cores_scarce: workers x threads per worker >= cores, on a backend whose async collectives
// need a thread of their own (the CPU's); ranks: the communicator's size (one rank: always
// inline). Throws InputError for a bad LOCKSTEP_COMM_MODE.
CommMode choose_comm_mode(bool cores_scarce, int ranks, std::size_t buckets);

class Reducer {
 public:
  // zero: reduce-scatter instead of all-reduce (Note [ZeRO-1]); dtype bf16: Note [bf16 gradient
  // reduction], converting on `device`. grads: the replica's gradient buffer; null under ZeRO-2
  // (zero true), where the reducer holds the buckets' buffers and the rank's gradient shards
  // itself (Note [ZeRO-2]).
  Reducer(const Model& model, Communicator& comm, Device& device, float* grads,
          std::vector<Bucket> buckets, bool overlap, bool zero, CommMode mode, ReduceDtype dtype,
          std::vector<TraceEvent>* comm_track);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  // Buckets [0, launched()) have started this step; backward is filling bucket launched().
  std::size_t launched() const noexcept { return launched_; }
  CommMode mode() const noexcept { return mode_; }

  // Before each backward whose gradients are to be reduced.
  void reset();
  // Whether this reducer holds the gradients itself (ZeRO-2: Note [ZeRO-2]).
  bool shards_gradients() const noexcept { return grads_ == nullptr; }
  // ZeRO-2, backward's GradientTarget: where layer `layer` accumulates its parameter gradients
  // (the tied layer's region for a tied one), opening its bucket first when it is not open.
  float* gradient_target(std::size_t layer);
  // ZeRO-2, the same place without opening anything (Replica::warm_up's target: the buffers
  // are zeroed when they are opened).
  float* warm_up_target(std::size_t layer);
  // The device bytes of gradients this reducer holds (ZeRO-2), or 0.
  std::size_t gradient_bytes() const noexcept;
  // The averaged gradient of this rank's shard of bucket i, once wait(i) returned: element
  // shard(i).begin first (in the replica's gradient buffer, or ZeRO-2's shard buffer).
  const float* shard_gradients(std::size_t i) const;
  // The backward hook: layer `layer`'s parameter gradients are final.
  void layer_ready(std::size_t layer);
  // After backward: starts every bucket not started yet, in order.
  void launch_remaining();
  // Where a captured backward must end a graph (Note [Step graphs] in step_graphs.hpp): what
  // layer_ready() would start, counted on a copy of the state reset() leaves, starting nothing.
  struct DryRun {
    std::vector<std::size_t> pending;
    std::size_t launched = 0;
  };
  DryRun dry_run() const;
  // Counts `layer` in `dry`; true when layer_ready(layer) would start a bucket there.
  bool dry_layer_ready(DryRun& dry, std::size_t layer) const;
  // Returns once bucket i's reduction may be used on the device's queue (on a GPU: the compute
  // stream waits for it, the host does not); returns the seconds the host spent blocked.
  double wait(std::size_t i);
  // ZeRO-1: this rank's shard of bucket i, as a range of the buffer; the whole bucket without.
  ShardRange shard(std::size_t i) const;
  // The non-empty shards of every bucket, in buffer order: what this rank's optimiser updates.
  std::vector<ShardRange> owned() const;
  // Grains of every bucket together (Note [ZeRO-1]): the global norm has one term per grain.
  std::size_t grains() const noexcept { return first_grain_.back(); }
  // The grains of this rank's shard of bucket i, as a range of the grain sums' indices.
  ShardRange shard_grains(std::size_t i) const;
  // sums[the grains of this rank's shard of bucket i] = their sums of squares of the reduced
  // gradient; the other entries are left as they are. `sums` is device memory of grains()
  // entries; queued on the device, no wait.
  void sum_grain_squares(std::size_t i, Device& device, double* sums) const;
  // ZeRO-1: every rank's grain sums into every rank's `sums` (Note [ZeRO-1]), one all-gather
  // per bucket, after the collectives started so far; returns once they may be used on the
  // device's queue (on a GPU the host does not wait). Nothing without ZeRO.
  void share_grain_sums(double* sums);
  // ZeRO-1: starts the all-gather of bucket i of `params` (every rank's updated shard).
  void start_gather(std::size_t i, float* params);
  // Blocks until every started all-gather is done; returns the seconds spent blocked.
  double wait_gathers();

  // Waits for all work in flight and ignores its errors: on the failure path, our buffers must
  // not be freed while a communication thread still uses them.
  void drain() noexcept;

  // The gradient bytes each step hands to the collectives: 2 per element in bf16, else 4.
  std::size_t bytes_per_step() const noexcept;

  // Counts the timings of waited collectives that have become known (CommWork::timing): at
  // once on the CPU, once the GPU has run them on a GPU. Call before reading the totals.
  void collect_timings();
  // Totals since construction of what collect_timings() counted, for the run summary.
  double comm_seconds() const noexcept { return comm_s_; }        // collective durations
  double exposed_seconds() const noexcept { return exposed_s_; }  // the queue waited for them

 private:
  // A waited collective whose timing is not known yet.
  struct Untimed {
    std::unique_ptr<CommWork> work;
    const char* what;  // "all-reduce", "reduce-scatter", "all-gather"
    std::size_t bucket;
  };
  void launch(std::size_t i);
  // The gradients of bucket i: in the replica's buffer, or ZeRO-2's buffer of it.
  float* bucket_data(std::size_t i);
  // ZeRO-2: layer's place in its bucket's buffer; opens the bucket when `open`.
  float* target(std::size_t layer, bool open);
  // ZeRO-2: waits for bucket i's reduce-scatter (starting the buckets up to it first if they
  // have not started) and copies the rank's shard out; its buffer is free then.
  double retire(std::size_t i);
  // Bucket i's bytes on the wire: half its gradient bytes in bf16 (never with ZeRO-1).
  std::size_t wire_bytes(std::size_t i) const noexcept;
  // Runs `collective` now, or starts it, as mode_ says.
  std::unique_ptr<CommWork> start(std::function<std::unique_ptr<CommWork>()> async,
                                  const std::function<void()>& blocking);
  double wait_for(std::unique_ptr<CommWork> work, const char* what, std::size_t i);

  Communicator& comm_;
  Device& device_;
  float* grads_;
  std::vector<Bucket> buckets_;
  bool overlap_;
  bool zero_;
  CommMode mode_;
  std::vector<TraceEvent>* comm_track_;
  DeviceArray<std::uint16_t> wire_;  // bf16: the buckets in bf16, laid out as the gradients
  std::vector<std::size_t> bucket_of_layer_;  // npos for layers without parameters
  std::vector<std::size_t> pending_;          // layers not yet ready, per bucket
  std::vector<std::size_t> first_grain_;      // per bucket, then the total (Note [ZeRO-1])
  // ZeRO-2 (Note [ZeRO-2]): the buckets' buffers, the rank's shards, and where each is.
  std::vector<std::size_t> grads_of_layer_;  // layer -> the offset of the region it writes
  GradientSlots slots_;
  DeviceArray<float> arena_;
  DeviceArray<float> shards_;
  std::vector<std::size_t> shard_at_;  // per bucket: where its shard starts in shards_
  std::vector<char> opened_, retired_;  // per bucket, this backward
  std::vector<std::unique_ptr<CommWork>> work_;
  std::vector<std::pair<std::size_t, std::unique_ptr<CommWork>>> gathers_;  // bucket, work
  std::vector<Untimed> untimed_;
  std::size_t launched_ = 0;  // buckets [0, launched_) have started
  double comm_s_ = 0.0;
  double exposed_s_ = 0.0;
};

}  // namespace lockstep::detail
