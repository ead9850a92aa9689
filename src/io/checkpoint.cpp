// CheckpointManager: a directory of step_<S>.safetensors + step_<S>.state pairs.
//
// Note [Checkpoint durability]
//   save() writes the weights, then the state, each with write_file_atomically() (temp file,
//   fsync, rename, fsync of the directory). A crash before the state's rename leaves new
//   weights with no state, or with the state of an earlier save of the same step; the state
//   names the checksum of its weights, so neither counts as complete, and loading falls back
//   to the previous checkpoint. Older checkpoints are removed only after the new one verifies,
//   so at every instant the directory holds at least one complete checkpoint once it has had
//   one.
#include "lockstep/checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "io/durable_file.hpp"
#include "io/state_file.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kWeightsExtension = ".safetensors";
constexpr std::string_view kStateExtension = ".state";

std::string stem_of(std::int64_t step) { return fmt::format("step_{:08}", step); }

CheckpointFiles files_of(const fs::path& dir, std::int64_t step) {
  const std::string stem = stem_of(step);
  return {.step = step,
          .weights = dir / (stem + std::string(kWeightsExtension)),
          .state = dir / (stem + std::string(kStateExtension))};
}

// 100 for "step_00000100"; nullopt for any other name, including non-canonical spellings such
// as "step_100", so that each step has exactly one pair of names.
std::optional<std::int64_t> step_of(std::string_view stem) {
  constexpr std::string_view prefix = "step_";
  if (!stem.starts_with(prefix)) return std::nullopt;
  const std::string_view digits = stem.substr(prefix.size());
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc{} || end != digits.data() + digits.size() || step < 0 ||
      stem != stem_of(step))
    return std::nullopt;
  return step;
}

// Steps that have at least one checkpoint file in `dir`, ascending; none if `dir` is missing.
std::vector<std::int64_t> steps_on_disk(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return {};
  if (ec) detail::fail_input(dir, "cannot list the checkpoint directory: " + ec.message());
  std::vector<std::int64_t> steps;
  for (const fs::directory_entry& entry : it) {
    const fs::path name = entry.path().filename();
    if (name.extension() != kWeightsExtension && name.extension() != kStateExtension) continue;
    if (const auto step = step_of(name.stem().string())) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

// Reads both files and checks that they belong together. Throws InputError.
Checkpoint load_pair(const fs::path& weights, const fs::path& state,
                     std::optional<std::int64_t> step_in_name) {
  for (const fs::path& file : {weights, state}) {
    std::error_code ec;
    if (!fs::exists(file, ec)) detail::fail_input(file, "missing (the save did not complete)");
  }
  SafetensorsFile w = read_safetensors(weights);
  detail::StateFile s = detail::read_state_file(state);
  if (step_in_name && s.state.step != *step_in_name)
    detail::fail_input(state, fmt::format("holds step {}, its name says {}", s.state.step,
                                          *step_in_name));
  const auto checksum = w.metadata.find("lockstep.checksum");
  if (checksum == w.metadata.end())
    detail::fail_input(weights, "no lockstep.checksum in the metadata: not a lockstep checkpoint");
  if (checksum->second != fmt::format("{:016x}", s.weights_checksum))
    detail::fail_input(state, fmt::format("belongs to weights with checksum {:016x}, but {} has {} "
                                          "(the files are of two different saves)",
                                          s.weights_checksum, weights.string(), checksum->second));
  // Note [Whole-file checksum]: without this, deleting the key would pass an edited header.
  if (s.version >= 2 && !w.metadata.contains("lockstep.file_checksum"))
    detail::fail_input(weights, "no lockstep.file_checksum in the metadata, which its state file "
                                "(version 2 or later) says every weights file beside it has: the "
                                "header was edited");
  for (const StateVector& v : s.optimizer_state)
    if (v.values.size() != w.data.size())
      detail::fail_input(state, fmt::format("state vector '{}' has {} values, the weights {}",
                                            v.name, v.values.size(), w.data.size()));
  return {.tensors = std::move(w.tensors),
          .params = std::move(w.data),
          .state = s.state,
          .optimizer_state = std::move(s.optimizer_state),
          .metadata = std::move(w.metadata),
          .weights_file = weights};
}

Checkpoint load_files(const CheckpointFiles& f) { return load_pair(f.weights, f.state, f.step); }

// Whether both files are there and verify. Incomplete or corrupt is not a checkpoint;
// load_latest() says why.
bool complete(const CheckpointFiles& f) {
  try {
    load_files(f);
    return true;
  } catch (const InputError&) {
    return false;
  }
}

// What save() refuses before writing anything, so that it never leaves half a checkpoint
// that could not load.
void check_savable(const Checkpoint& c) {
  detail::check_state(c.state, c.optimizer_state);
  for (const StateVector& v : c.optimizer_state)
    if (v.values.size() != c.params.size())
      throw std::invalid_argument(fmt::format(
          "checkpoint: state vector '{}' has {} values, the parameters {}", v.name,
          v.values.size(), c.params.size()));
}

}  // namespace

CheckpointManager::CheckpointManager(fs::path dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last) {
  if (keep_last < 0)
    throw std::invalid_argument(
        fmt::format("checkpoint: keep_last must be >= 0, got {}", keep_last));
}

CheckpointFiles CheckpointManager::save(const Checkpoint& ckpt,
                                        const std::function<void()>& stage_done) {
  const auto stage = [&] {
    if (stage_done) stage_done();
  };
  check_savable(ckpt);
  fs::create_directories(dir_);
  const std::int64_t step = ckpt.state.step;
  const CheckpointFiles files = files_of(dir_, step);
  std::map<std::string, std::string> metadata = ckpt.metadata;
  metadata["lockstep.step"] = std::to_string(step);
  const std::uint64_t checksum = write_safetensors(files.weights, ckpt.tensors, ckpt.params, metadata);
  stage();
  detail::write_state_file(files.state, ckpt.state, ckpt.optimizer_state, checksum);
  stage();

  // See Note [Checkpoint durability]: nothing goes before the new checkpoint verifies.
  try {
    load_files(files);
  } catch (const InputError& e) {
    throw std::runtime_error(fmt::format("the checkpoint just written does not verify: {}",
                                         e.what()));
  }
  stage();
  if (keep_last_ == 0) return files;

  // Keep the newest keep_last - 1 complete checkpoints below `step` (just verified above):
  // walking down from the newest, each older pair is read once, and only until enough are kept.
  const std::vector<std::int64_t> on_disk = steps_on_disk(dir_);
  std::vector<std::int64_t> kept;
  for (auto it = on_disk.rbegin(); it != on_disk.rend() && std::cmp_less(kept.size() + 1, keep_last_); ++it) {
    if (*it >= step) continue;
    if (complete(files_of(dir_, *it))) kept.push_back(*it);
  }
  for (const std::int64_t old : on_disk) {
    if (old >= step) break;
    if (std::find(kept.begin(), kept.end(), old) != kept.end()) continue;
    const CheckpointFiles doomed = files_of(dir_, old);
    // The state first: without it the pair is incomplete at once, whatever happens next.
    fs::remove(doomed.state);
    fs::remove(doomed.weights);
  }
  stage();
  return files;
}

std::vector<CheckpointFiles> CheckpointManager::list() const {
  std::vector<CheckpointFiles> out;
  for (const std::int64_t step : steps_on_disk(dir_))
    if (complete(files_of(dir_, step))) out.push_back(files_of(dir_, step));
  return out;
}

std::optional<Checkpoint> CheckpointManager::load_latest(const Warn& warn) const {
  // A live run may remove checkpoints between our listing and our reads (keep_last): when none
  // listed is valid and a file has vanished meanwhile, the listing is stale and is made again.
  constexpr int kListings = 5;
  std::vector<std::int64_t> steps;
  std::vector<std::string> skipped;
  for (int listing = 0; listing < kListings; ++listing) {
    steps = steps_on_disk(dir_);
    if (steps.empty()) return std::nullopt;
    skipped.clear();
    bool vanished = false;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const CheckpointFiles files = files_of(dir_, *it);
      try {
        Checkpoint ckpt = load_files(files);
        if (warn)
          for (const std::string& reason : skipped)
            warn(fmt::format("{}; using the previous checkpoint {}", reason, stem_of(*it)));
        return ckpt;
      } catch (const InputError& e) {
        std::error_code ec;
        vanished = vanished || !fs::exists(files.weights, ec) || !fs::exists(files.state, ec);
        skipped.emplace_back(e.what());
      }
    }
    if (!vanished) break;
  }
  throw InputError(fmt::format("{}: none of the {} checkpoints is valid: {}", dir_.string(),
                               steps.size(), fmt::join(skipped, "; ")));
}

std::optional<fs::path> CheckpointManager::whole_weights() const {
  const std::vector<std::int64_t> steps = steps_on_disk(dir_);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const fs::path weights = files_of(dir_, *it).weights;
    try {
      if (read_safetensors(weights).metadata.contains("lockstep.checksum")) return weights;
    } catch (const InputError&) {
      // missing or corrupt: an older one may do
    }
  }
  return std::nullopt;
}

Checkpoint CheckpointManager::load(const fs::path& path, const Warn& warn) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::optional<Checkpoint> latest = CheckpointManager(path, 0).load_latest(warn);
    if (!latest) {
      // A folder of runs (runs/ rather than runs/NAME) is named with the runs inside it.
      const auto holds_checkpoints = [](const fs::path& dir) {
        try {
          return !steps_on_disk(dir).empty();
        } catch (const InputError&) {
          return false;  // a subfolder we cannot list is not named
        }
      };
      std::vector<std::string> runs;
      for (const fs::directory_entry& sub : fs::directory_iterator(path, ec))
        if (sub.is_directory(ec) && holds_checkpoints(sub.path()))
          runs.push_back(sub.path().string());
      std::sort(runs.begin(), runs.end());
      detail::fail_input(path, fmt::format("no checkpoint (step_NNNNNNNN{} and {} files){}",
                                           kWeightsExtension, kStateExtension,
                                           runs.empty() ? "" : fmt::format(
                                               "; its subfolders hold some: name one of {}",
                                               fmt::join(runs, ", "))));
    }
    return std::move(*latest);
  }
  const fs::path extension = path.extension();
  if (extension != kWeightsExtension && extension != kStateExtension)
    detail::fail_input(path, fmt::format("expected a checkpoint directory or a {} or {} file",
                                         kWeightsExtension, kStateExtension));
  fs::path weights = path, state = path;
  weights.replace_extension(kWeightsExtension);
  state.replace_extension(kStateExtension);
  // A renamed pair ("best.safetensors") loads too; only a canonical name is checked against the
  // step inside.
  return load_pair(weights, state, step_of(path.stem().string()));
}

void check_layout(const Checkpoint& ckpt, std::span<const ParamTensor> expected) {
  const auto fail = [&](const std::string& what) { detail::fail_input(ckpt.weights_file, what); };
  const auto shape = [](const ParamTensor& t) {
    return fmt::format("[{}]", fmt::join(t.shape, ", "));
  };
  for (const ParamTensor& e : expected) {
    const auto it = std::find_if(ckpt.tensors.begin(), ckpt.tensors.end(),
                                 [&](const ParamTensor& t) { return t.name == e.name; });
    if (it == ckpt.tensors.end())
      fail(fmt::format("tensor '{}': missing; the model expects shape {}", e.name, shape(e)));
    if (it->shape != e.shape)
      fail(fmt::format("tensor '{}': shape {}, the model expects {}", e.name, shape(*it),
                       shape(e)));
    if (it->offset != e.offset)
      fail(fmt::format("tensor '{}': at element {} of the buffer, the model expects {} (written "
                       "in another layout)", e.name, it->offset, e.offset));
  }
  for (const ParamTensor& t : ckpt.tensors)
    if (std::none_of(expected.begin(), expected.end(),
                     [&](const ParamTensor& e) { return e.name == t.name; }))
      fail(fmt::format("tensor '{}': not in the model", t.name));
}

}  // namespace lockstep
