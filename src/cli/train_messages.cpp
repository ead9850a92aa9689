#include "cli/train_messages.hpp"

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <cstring>
#include <optional>
#include <string_view>

namespace lockstep::cli {
namespace fs = std::filesystem;
namespace {

// `arg` as one word for a POSIX shell: as it is when that is safe, else in single quotes.
std::string shell_word(std::string_view arg) {
  const bool plain = !arg.empty() && arg.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_-./=:,+@%") == std::string_view::npos;
  if (plain) return std::string(arg);
  std::string out = "'";
  for (const char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void write_all(std::string_view text) noexcept {
  while (!text.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

void print_outputs(std::FILE* out, const Config& cfg, const std::string& summary_json) {
  const TrainerConfig& tc = cfg.trainer;
  std::vector<std::string> parts;
  if (!summary_json.empty()) parts.push_back("summary " + summary_json);
  if (!tc.report.empty()) parts.push_back("report " + tc.report);
  if (!tc.metrics.empty()) parts.push_back("metrics " + tc.metrics + " (appended)");
  if (!tc.trace.empty()) parts.push_back("trace " + tc.trace);
  if (!tc.checkpoint.dir.empty()) parts.push_back("checkpoints " + tc.checkpoint.dir);
  if (!parts.empty()) fmt::print(out, "outputs: {}\n", fmt::join(parts, "; "));
}

void print_resume_changes(std::FILE* out, const Trainer& trainer) {
  for (const ConfigChange& c : trainer.resume_changes())
    fmt::print(out, "  changed on resume: {} {} -> {} (from step {} on)\n", c.key, c.checkpoint,
               c.now, trainer.resumed_step() + 1);
}

std::string init_from_hint(const fs::path& dir, const std::string& config,
                           const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  std::optional<fs::path> weights;
  try {
    weights = CheckpointManager(dir, 0).whole_weights();
  } catch (const InputError&) {
    return {};
  }
  if (!weights) return {};
  // A directory of its own: `dir` holds another run's checkpoint files, which a new run leaves
  // alone (Note [A used checkpoint directory]).
  fs::path own = dir.lexically_normal();
  if (own.filename().empty()) own = own.parent_path();
  own += "-new";
  std::string command = "lockstep train " + shell_word(config);
  for (const std::string& o : overrides)
    if (!o.starts_with("trainer.checkpoint.dir=")) command += " --set " + shell_word(o);
  command += " --set " + shell_word("trainer.checkpoint.dir=" + own.string()) + " --init-from " +
             shell_word(weights->string());
  return fmt::format("\n  the weights in {} are whole; to keep them, start a new run from them "
                     "(step 0, a fresh optimiser and schedule):\n    {}",
                     weights->string(), command);
}

namespace {

// `value` in decimal, at least `width` digits (zero-padded), at the end of `buffer`.
std::string_view decimal(std::uint64_t value, std::size_t width, char (&buffer)[24]) noexcept {
  std::size_t n = 0;
  do {
    buffer[sizeof buffer - 1 - n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0 || n < width);
  return {buffer + sizeof buffer - n, n};
}

// Whether DIR/step_NNNNNNNN.EXTENSION exists (the names CheckpointManager gives), with no
// allocation: each file of a save appears by a rename once it is whole.
bool step_file_exists(std::string_view dir, std::string_view step, std::string_view extension) noexcept {
  char path[4096];
  std::size_t n = 0;
  for (const std::string_view part : {dir, std::string_view("/step_"), step, extension}) {
    if (n + part.size() >= sizeof path) return false;
    std::memcpy(path + n, part.data(), part.size());
    n += part.size();
  }
  path[n] = '\0';
  return ::access(path, F_OK) == 0;
}

}  // namespace

void write_stop_line(int sig, std::int64_t agreed_step, bool checkpoint, bool new_line) noexcept {
  const bool ctrl_c = sig == SIGINT;
  if (new_line) write_all("\n");
  write_all(ctrl_c ? "lockstep: Ctrl-C: " : "lockstep: SIGTERM: ");
  if (agreed_step < 0) {  // still starting: the config may not be read yet
    write_all("stopping after the run's first step (with a checkpoint when "
              "trainer.checkpoint.dir is set), then exit");
    write_all(ctrl_c ? "; Ctrl-C again to quit now\n" : "\n");
    return;
  }
  char digits[24];
  write_all("stopping after step ");
  write_all(decimal(static_cast<std::uint64_t>(agreed_step + 1), 1, digits));
  write_all(checkpoint ? ": checkpoint, then exit (no final eval)"
                       : ", then exit (no trainer.checkpoint.dir: nothing is saved)");
  if (ctrl_c) write_all(checkpoint ? "; Ctrl-C again to quit without one" : "; Ctrl-C again to quit now");
  write_all("\n");
}

void write_exit_now_line(std::int64_t saving_step, const char* checkpoint_dir,
                         std::int64_t complete_step) noexcept {
  if (saving_step < 0) {
    write_all("lockstep: second SIGINT: exiting at once (no checkpoint was being written)\n");
    return;
  }
  char digits[24];
  const std::string_view step = decimal(static_cast<std::uint64_t>(saving_step), 1, digits);
  char padded[24];
  const std::string_view name = decimal(static_cast<std::uint64_t>(saving_step), 8, padded);
  const std::string_view dir = checkpoint_dir ? checkpoint_dir : "";
  // Both files renamed into place: the save is past its writes; what is left (verifying,
  // pruning older ones) does not decide whether it resumes.
  if (!dir.empty() && step_file_exists(dir, name, ".safetensors") &&
      step_file_exists(dir, name, ".state")) {
    write_all("lockstep: second SIGINT while finishing the checkpoint of step ");
    write_all(step);
    write_all(": exiting at once; both its files are in place, and --resume starts from it\n");
    return;
  }
  write_all("lockstep: second SIGINT while writing the checkpoint of step ");
  write_all(step);
  if (complete_step < 0) {
    write_all(": exiting at once; it stays incomplete, and no earlier checkpoint in its directory "
              "is complete: --resume has none to start from\n");
    return;
  }
  char earlier[24];
  write_all(": exiting at once; it stays incomplete, and --resume falls back to the previous "
            "complete checkpoint, of step ");
  write_all(decimal(static_cast<std::uint64_t>(complete_step), 1, earlier));
  write_all("\n");
}

std::int64_t newest_complete_step(const fs::path& dir) {
  // Not a directory (yet, or ever: the Trainer's own check names what is wrong with it).
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return -1;
  const std::vector<std::int64_t> steps = CheckpointManager(dir, 0).steps_with_files();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    char padded[24];
    const std::string_view name = decimal(static_cast<std::uint64_t>(*it), 8, padded);
    if (step_file_exists(dir.string(), name, ".safetensors") &&
        step_file_exists(dir.string(), name, ".state"))
      return *it;
  }
  return -1;
}

}  // namespace lockstep::cli
