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

// Async-signal-safe: the line a second SIGINT prints before the process exits at once. When
// `saving_step` >= 0, whether that step's checkpoint in `checkpoint_dir` (null: unknown) has
// both its files in place (--resume starts from it) or stays incomplete.
void write_exit_now_line(std::int64_t saving_step, const char* checkpoint_dir) noexcept;

}  // namespace lockstep::cli
