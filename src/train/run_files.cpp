#include "train/run_files.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

FileRoles run_files(const Config& cfg) {
  const DataConfig& d = cfg.data;
  const TrainerConfig& t = cfg.trainer;
  FileRoles files;
  // The config file it was read from, when it was (a config made in code says "<defaults>").
  std::error_code ec;
  if (std::filesystem::is_regular_file(cfg.source, ec)) files.input(cfg.source, "the config");
  files.input(d.path, "data.path")
      .input(d.eval_path, "data.eval_path")
      .input(d.images, "data.images")
      .input(d.labels, "data.labels")
      .input_dir(d.tokenizer, "data.tokenizer", kTokenizerFiles)
      .output(t.trace, "trainer.trace")
      .output(t.report, "trainer.report")
      .output(t.metrics, "trainer.metrics");
  return files;
}

void check_checkpoint_dir_for_new_run(const Config& cfg) {
  const CheckpointConfig& c = cfg.trainer.checkpoint;
  std::error_code ec;
  // Not a directory: check_output_dir says what is wrong with it.
  if (c.dir.empty() || c.overwrite || !std::filesystem::is_directory(c.dir, ec)) return;
  const std::vector<std::int64_t> steps = CheckpointManager(c.dir, 0).steps_with_files();
  if (steps.empty()) return;
  throw InputError(fmt::format(
      "trainer.checkpoint.dir {}: holds the checkpoints of another run (step{} {}); a new run "
      "would replace them and prune them by keep_last. --resume continues that run; "
      "--overwrite (trainer.checkpoint.overwrite: true) starts over, removing them; or give "
      "another trainer.checkpoint.dir",
      c.dir, steps.size() > 1 ? "s" : "",
      steps.size() > 1 ? fmt::format("{} to {}", steps.front(), steps.back())
                       : std::to_string(steps.front())));
}

}  // namespace lockstep::detail
