// Checking, before a run starts, that what it will write can be written.
//
// Note [Checking an output]
// A run writes its outputs (trainer.trace, trainer.checkpoint.dir, the CLI's --summary-json,
// trainer.report, export --out) after hours of training, or as it goes. A path that cannot be
// written is the user's mistake and is found in a moment, so it is refused before step 1 with
// exit 2, naming the key or flag: a parent directory that cannot be made or is not writable, a
// directory where a file goes, a file where a directory goes. A run's outputs (trainer.trace,
// trainer.report, trainer.metrics, --summary-json) get their missing directories made, as
// checkpoint directories do (prepare_output_file); export --out must name an existing directory. What can still fail later (a full
// disk) fails then, as a run-time error. The check follows symlinks, as the writes do
// (write_file_atomically replaces a link's target and keeps the link).
#pragma once

#include <filesystem>
#include <string_view>

#include "lockstep/export.hpp"

namespace lockstep::detail {

// Throws InputError "WHAT FILE: REASON" unless write_file_atomically(file) can create or
// replace `file`. Exported for the CLI.
LOCKSTEP_API void check_output_file(const std::filesystem::path& file, std::string_view what);

// The same for a run's outputs, whose directories are made as checkpoint directories are: makes
// the missing directories above `file` first (InputError naming WHAT if it cannot).
LOCKSTEP_API void prepare_output_file(const std::filesystem::path& file, std::string_view what);

// Throws InputError "WHAT DIR: REASON" unless `dir` is a writable directory or can be created:
// its nearest existing ancestor is a writable directory.
LOCKSTEP_API void check_output_dir(const std::filesystem::path& dir, std::string_view what);

// `path` with every symlink in its last component followed (a dangling link's target too);
// `path` itself when it is no link. What write_file_atomically writes to.
std::filesystem::path follow_links(const std::filesystem::path& path);

}  // namespace lockstep::detail
