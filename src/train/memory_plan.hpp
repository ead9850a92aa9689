// The memory a run needs, worked out before anything large is allocated.
//
// Note [Memory plan]
// A size from the input (model.hidden, data.batch_size, model.context, or a CSV label of 10^9
// that makes 10^9 classes) could ask for terabytes; the allocation would then fail deep inside
// a worker as a bare std::bad_alloc, or the kernel would kill the process. So the Trainer works
// out each worker's bytes from the model and the batch (parameters, gradients, optimiser state,
// activations and what the layers keep for backward, the staged batches) and the host bytes of
// the dataset, before step 1, and compares them with what this process may use: physical memory
// (sysconf), the cgroup's memory.max, and RLIMIT_AS. A plan over that is refused as bad input
// naming the key that drives it. The plan is a lower bound (allocator slack, thread stacks and
// BLAS buffers are not counted), so it refuses only what cannot fit, never a run that could.
// Workers on a GPU are compared with the device's memory as well.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

struct MemoryPlan {
  // One worker's bytes; under trainer.zero 1 the optimiser state of the worker that holds the
  // most (shards differ by at most a grain per bucket), as the summary reports it.
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, staging = 0;
  // The frozen parameters (a LoRA model's base; Note [Frozen parameters] in
  // src/model/lora.cpp): held by every worker, without gradients or optimiser state.
  double frozen = 0;
  // Gradient bytes a worker hands to its collectives per step (4 a trainable parameter, 2 with
  // trainer.grad_reduce_dtype bf16).
  double gradient_wire = 0;
  int zero_ranks = 0;              // trainer.zero 1, 2: the ranks that share the optimiser state
  int zero = 0;                    // trainer.zero
  // trainer.zero 2 without accumulation: `gradients` are the worker's shards and the buckets'
  // buffers (Note [ZeRO-2] in reducer.hpp); otherwise the whole buffer.
  bool gradients_sharded = false;
  // trainer.recompute, and whether the model has layers it would recompute (a GPT's blocks):
  // `activations` are for that mode (Note [Recomputation] in src/model/model.cpp).
  Recompute recompute = Recompute::none;
  bool recomputable = false;
  // cuDNN's fused attention backward, in the device's own working memory (cuda, bf16, fused):
  // cudnn_attention_backward_bytes at the run's shape, and packed windows' (B, 1, T, T) bf16 mask.
  double attention_workspace = 0;
  int workers = 0;                 // in this process
  bool workers_on_host = true;     // CPU workers: their bytes are host memory
  double dataset = 0;              // host bytes of the train and eval splits
  double host_copies = 0;          // the host's copies of the parameters (initial, final)
  // trainer.snapshot_every: the newest snapshot and the one being built (Note [Shrink] in
  // recovery.hpp), each the parameters and the whole optimiser state
  double snapshots = 0;
  std::string driver;              // "model.hidden[0] = 2000000000": what makes it large

  double per_worker() const {
    return parameters + frozen + gradients + optimizer + activations + staging +
           attention_workspace;
  }
  double host() const {
    return dataset + host_copies + snapshots + (workers_on_host ? workers * per_worker() : 0.0);
  }
};

// What this process may allocate: the least of physical memory, the cgroup limit and
// RLIMIT_AS, and where that figure comes from ("physical memory", "cgroup memory.max", ...).
struct MemoryLimit {
  double bytes = 0;
  std::string source;
};
MemoryLimit host_memory_limit();

// `ranks`: the workers of the whole job (this process's times the processes), among which
// trainer.zero 1 shards the optimiser state. `cudnn_attention`: the GPT's attention runs cuDNN's
// fused path (cuda, bf16).
MemoryPlan plan_memory(const Config& cfg, const Model& model, const Dataset& train,
                       const Dataset* eval, bool workers_on_host, int ranks,
                       bool cudnn_attention = false);

// Note [cuDNN attention memory]
// The device memory one call of cuDNN's fused attention backward takes on top of what the
// layers hold (CudaDevice::attention_backward; Note [cuDNN attention]), in bytes: the bf16
// gradient (B T, (H + 2 Hkv) D: (B T, 3C) without grouped-query attention) it writes before
// widening, rounded up to 256 bytes, and the plan's workspace. With fewer kv heads the frontend
// computes each query head's dK and dV and sums them over the group in the fused graph (virtual
// tensors, no workspace of their own); unmeasured on a GPU. What the cuDNN frontend 1.32 headers show (node/scaled_dot_product_flash_attention.h):
//   - its own part: the softmax sums, B H T fp32; without the dP workspace also the fp32 dQ
//     accumulator, B H T D;
//   - a deterministic backward takes the dP-workspace path whenever it is asked for, on sm_90 at
//     any cuDNN (from 9.25 the ordered-dQ path instead only when CUDNN_FRONTEND_ATTN_DP_
//     WORKSPACE_LIMIT is set below the need, which lockstep never sets);
//   - the dP workspace's size is the frontend's own estimate of it, B H T64 T64 x 2 bytes (T64:
//     T rounded up to 64), used for its limit checks.
// The dP workspace itself is allocated by the backend engine, whose size the headers do not
// show: that it is this estimate, about 201 MB at B 8, T 1024, H 12 and 1.6 GB at B 64, is from
// issue 40's reading, to be confirmed on a GPU (bench_attention prints cuDNN's figure).
double cudnn_attention_backward_bytes(const AttentionShape& shape, bool deterministic);

// InputError "SOURCE: model.hidden[0] = 2000000000 needs 16.0 GB per worker (...); 3.8 GB
// available (physical memory)" when the plan's host bytes exceed `limit`.
void check_memory_plan(const MemoryPlan& plan, const MemoryLimit& limit, const Config& cfg);

// What a refusal suggests, " (...)", or "": trainer.recompute full where activations are most
// of the plan and the model has blocks to recompute, trainer.zero 2 where the model's state is.
std::string memory_suggestion(const MemoryPlan& plan);

// One line for --dry-run and the summary: per worker by part, host, and the limit.
std::string describe(const MemoryPlan& plan, const MemoryLimit& limit);

// In binary units: "14.9 GiB", "512.0 MiB", "1000 B".
std::string format_bytes(double bytes);

}  // namespace lockstep::detail
