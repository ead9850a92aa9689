// What `lockstep train` says around a run: where its outputs go, what a resume changed, the
// command that keeps the weights of an interrupted save, and the line a second SIGINT prints.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

// "outputs: summary S; report R; metrics M (appended); trace T; checkpoints D", naming only
// those configured; nothing when none is.
void print_outputs(std::FILE* out, const Config& cfg, const std::string& summary_json);

// One line per key the resumed run changed (Trainer::resume_changes()).
void print_resume_changes(std::FILE* out, const Trainer& trainer);

// When no checkpoint in `dir` is complete but the weights of one are whole: the exact command
// that starts a new run from them, saving into DIR-new ("lockstep train CONFIG --set ...
// --set trainer.checkpoint.dir=DIR-new --init-from WEIGHTS"), as
// lines to append to the error; "" otherwise.
std::string init_from_hint(const std::filesystem::path& dir, const std::string& config,
                           const std::vector<std::string>& overrides);

// Async-signal-safe: the line the first SIGINT or a SIGTERM prints at once, before the step
// ends: "lockstep: Ctrl-C: stopping after step N: checkpoint, then exit (no final eval); Ctrl-C
// again to quit without one". N is the step after `agreed_step`, the last whose stop decision
// the workers agreed on (-1: none yet, the run has not begun); `checkpoint`: whether
// trainer.checkpoint.dir is set; `new_line`: end a progress line being redrawn first.
void write_stop_line(int sig, std::int64_t agreed_step, bool checkpoint, bool new_line) noexcept;

// Async-signal-safe: the line a second SIGINT prints before the process exits at once. When
// `saving_step` >= 0, whether that step's checkpoint in `checkpoint_dir` (null: unknown) has
// both its files in place (--resume starts from it) or stays incomplete, and then the earlier
// complete checkpoint --resume falls back to: `complete_step`, or -1 when there is none.
void write_exit_now_line(std::int64_t saving_step, const char* checkpoint_dir,
                         std::int64_t complete_step) noexcept;

// The newest step in `dir` with both checkpoint files in place (not verified), or -1.
std::int64_t newest_complete_step(const std::filesystem::path& dir);

}  // namespace lockstep::cli
