// Settings that a run can never honour, said rather than dropped in silence.
//
// Note [A setting that cannot take effect]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A key set away from its default asks for something. Where the run cannot do it at all, the
// user is told before step 1, one of two ways:
//   - an error (InputError, exit 2) where the setting contradicts the run: trainer.min_workers
//     above the run's workers (a shrink could never go on, nor the run start as asked);
//   - a warning on stderr where the run is still the one asked for, only without that setting:
//     a CUDA-only setting on the CPU backend (trainer.cuda_graphs: on, trainer.comm: nccl or
//     peer), a CPU-only one on cuda (trainer.threads_per_device), and a shrink-only one
//     (trainer.min_workers, keep_global_batch, snapshot_every) under on_worker_failure: stop.
// Settings whose CPU meaning docs/config.md gives (trainer.precision: tf32 computes fp32
// there) are not in this class. The backend is the one the run will use (backend_name() for
// auto).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/export.hpp"

namespace lockstep::detail {

// Throws InputError for a contradiction; returns one warning per setting left without effect
// (Note [A setting that cannot take effect]). `workers`: the run's, over every process.
LOCKSTEP_API std::vector<std::string> settings_without_effect(const Config& cfg,
                                                              std::string_view backend,
                                                              int workers);

}  // namespace lockstep::detail
