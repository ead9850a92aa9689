// What a training run reads and writes, checked before it starts: no output is an input (Note
// [An output is never an input] in io/file_roles.hpp), and a new run leaves another run's
// checkpoints alone (Note [A used checkpoint directory]).
#pragma once

#include "io/file_roles.hpp"
#include "lockstep/config.hpp"
#include "lockstep/export.hpp"

namespace lockstep::detail {

// The config file (Config::source, when it names one) and the config's data files as inputs
// (data.path, data.eval_path, data.images, data.labels, data.tokenizer), and its trainer.trace,
// trainer.report and trainer.metrics as outputs, for the caller to add its own (the CLI's
// --summary-json, --resume, --init-from) and check().
LOCKSTEP_API FileRoles run_files(const Config& cfg);

// Note [A used checkpoint directory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A new run (not a resume) saving into a directory that holds checkpoints would replace them
// step by step and prune the rest by keep_last: another run's work gone, in silence. So a new
// run refuses such a directory (InputError naming it and the ways on: --resume continues that
// run; trainer.checkpoint.overwrite: true, the CLI's --overwrite, starts over: the Trainer
// removes them once it holds the directory's lock, before step 1, so that no newer step of the
// old run is later taken for this one's; or another trainer.checkpoint.dir), as Hugging Face's
// Trainer refuses a non-empty output directory without overwrite_output_dir. A resume continues
// the run whose checkpoints they are. Checked before anything is written, by the CLI (before
// --dry-run's plan) and by the Trainer when it starts, under the directory's lock.
LOCKSTEP_API void check_checkpoint_dir_for_new_run(const Config& cfg);

}  // namespace lockstep::detail
