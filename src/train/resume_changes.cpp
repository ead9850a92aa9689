// Note [What a resume may change]
//   A checkpoint's weights and optimiser state mean something only under the model, data and
//   optimiser that produced them: a resume under another model.* or data.* (or optimizer.type,
//   momentum, betas, eps, decay_all, trainer.seed) would continue a different run and is refused,
//   naming each changed key. The learning rate and its schedule, weight decay and gradient
//   clipping only scale or bound the updates still to come: changing them is what one does after
//   a loss spike, so a resume accepts them and applies them from the resumed step on (the
//   schedule is a function of the step: learning_rate() in optimizer.hpp). The trainer keys but
//   trainer.seed (steps, cadence of logging, eval and checkpoints, devices), data.prefetch and
//   model.attention (the same function computed another way, as trainer.precision) say how and
//   for how long to train; config_hash() leaves them out, and they may change too.
//   State files before version 3 record the hash alone: for them a changed hash is refused, as
//   before, since the keys that changed cannot be named.
#include "train/resume_changes.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

constexpr std::string_view kAbsent = "(absent)";

// Keys the config hash covers but a resume may change.
constexpr std::array<std::string_view, 3> kSafeOptimizerKeys = {
    "optimizer.lr", "optimizer.weight_decay", "optimizer.clip_grad_norm"};

std::string describe(const ConfigChange& c) {
  return fmt::format("{}: {} in the checkpoint, {} now", c.key, c.checkpoint, c.now);
}

}  // namespace

std::vector<ConfigChange> config_changes(const ConfigValues& checkpoint, const ConfigValues& now) {
  const auto find = [](const ConfigValues& values, const std::string& key) {
    return std::find_if(values.begin(), values.end(),
                        [&](const auto& kv) { return kv.first == key; });
  };
  std::vector<ConfigChange> out;
  for (const auto& [key, value] : now) {
    const auto old = find(checkpoint, key);
    const std::string before = old == checkpoint.end() ? std::string(kAbsent) : old->second;
    if (before != value) out.push_back({.key = key, .checkpoint = before, .now = value});
  }
  for (const auto& [key, value] : checkpoint)
    if (find(now, key) == now.end())
      out.push_back({.key = key, .checkpoint = value, .now = std::string(kAbsent)});
  return out;
}

bool resume_may_change(const std::string& key) {
  if (key.starts_with("schedule.") || key == "data.prefetch" || key == "model.attention")
    return true;
  if (key.starts_with("trainer.")) return key != "trainer.seed";
  return std::find(kSafeOptimizerKeys.begin(), kSafeOptimizerKeys.end(), key) !=
         kSafeOptimizerKeys.end();
}

std::vector<ConfigChange> check_resume_changes(const std::string& checkpoint_file,
                                               const ConfigValues& checkpoint,
                                               const ConfigValues& now, bool hashes_differ) {
  const std::vector<ConfigChange> changes = config_changes(checkpoint, now);
  std::vector<std::string> refused, accepted;
  for (const ConfigChange& c : changes)
    (resume_may_change(c.key) ? accepted : refused).push_back(describe(c));
  const bool explained = std::any_of(changes.begin(), changes.end(), [](const ConfigChange& c) {
    return c.key.starts_with("optimizer.") || c.key.starts_with("schedule.");
  });
  if (refused.empty() && (!hashes_differ || explained)) return changes;
  if (refused.empty())
    refused.emplace_back("none of its keys, yet its config hash differs (a checkpoint of "
                         "another lockstep version?)");
  throw InputError(fmt::format(
      "{}: written by a different configuration; a resume cannot change {}{}. A resume may "
      "change only optimizer.lr, optimizer.weight_decay, optimizer.clip_grad_norm, schedule.*, "
      "data.prefetch, model.attention and the trainer keys but trainer.seed",
      checkpoint_file, fmt::join(refused, "; "),
      accepted.empty() ? std::string()
                       : fmt::format(" (it could change {})", fmt::join(accepted, "; "))));
}

}  // namespace lockstep::detail
