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
  int zero_ranks = 0;              // trainer.zero 1: the ranks that share the optimiser state
  int workers = 0;                 // in this process
  bool workers_on_host = true;     // CPU workers: their bytes are host memory
  double dataset = 0;              // host bytes of the train and eval splits
  double host_copies = 0;          // the host's copies of the parameters (initial, final)
  // trainer.snapshot_every: the newest snapshot and the one being built (Note [Shrink] in
  // recovery.hpp), each the parameters and the whole optimiser state
  double snapshots = 0;
  std::string driver;              // "model.hidden[0] = 2000000000": what makes it large

  double per_worker() const { return parameters + gradients + optimizer + activations + staging; }
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
// trainer.zero 1 shards the optimiser state.
MemoryPlan plan_memory(const Config& cfg, const Model& model, const Dataset& train,
                       const Dataset* eval, bool workers_on_host, int ranks);

// InputError "SOURCE: model.hidden[0] = 2000000000 needs 16.0 GB per worker (...); 3.8 GB
// available (physical memory)" when the plan's host bytes exceed `limit`.
void check_memory_plan(const MemoryPlan& plan, const MemoryLimit& limit, const Config& cfg);

// One line for --dry-run and the summary: per worker by part, host, and the limit.
std::string describe(const MemoryPlan& plan, const MemoryLimit& limit);

// In binary units: "14.9 GiB", "512.0 MiB", "1000 B".
std::string format_bytes(double bytes);

}  // namespace lockstep::detail
