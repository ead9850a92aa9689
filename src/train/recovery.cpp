// Note [Shrink] in recovery.hpp.
#include "train/recovery.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace lockstep::detail {

CommonState common_state(std::span<const Survivor> survivors, int zero) {
  if (zero > 0)
    return {.step = std::nullopt,
            .why = fmt::format("with trainer.zero: {} the lost worker held its shard of the "
                               "optimizer state{}",
                               zero, zero > 1 ? " and of the gradients" : "")};
  const SurvivorProgress* reference = nullptr;
  for (const Survivor& s : survivors) {
    if (!s.progress) return {.step = std::nullopt, .why = fmt::format("worker {} could not report its state", s.rank)};
    const SurvivorProgress& p = *s.progress;
    if (!p.lacks.empty()) return {.step = std::nullopt, .why = fmt::format("worker {} {}", s.rank, p.lacks)};
    if (reference && (p.updated != reference->updated || p.param_hash != reference->param_hash))
      return {.step = std::nullopt, .why = fmt::format("the survivors differ: the state after step {} with parameter "
                                 "hash {:016x}, and after step {} with {:016x}",
                                 reference->updated, reference->param_hash, p.updated,
                                 p.param_hash)};
    if (!reference) reference = &p;
  }
  if (!reference) return {.step = std::nullopt, .why = "no worker is left"};
  return {.step = reference->updated, .why = {}};
}

namespace {

RecoveryChoice cannot(std::string why) {
  return {.source = RecoverySource::none, .step = 0, .redone = 0, .why = std::move(why)};
}

}  // namespace

RecoveryChoice choose_recovery(const RecoveryInput& in) {
  const int left = static_cast<int>(in.survivors.size());
  if (in.processes > 1)
    return cannot(fmt::format("the run spans {} processes, whose communicators cannot be rebuilt "
                               "from one of them",
                              in.processes));
  if (left < in.min_workers)
    return cannot(fmt::format("{} of {} workers are left, fewer than trainer.min_workers = {}",
                              left, in.workers, in.min_workers));
  // Every step before the failed one had its update applied on every replica; the survivors
  // may have applied the failed step's too (a loss in its update phase).
  std::int64_t applied = in.failed_step - 1;
  for (const Survivor& s : in.survivors)
    if (s.progress) applied = std::max(applied, s.progress->updated);
  const auto from = [&](RecoverySource source, std::int64_t step, std::string why) {
    return RecoveryChoice{.source = source,
                          .step = step,
                          .redone = std::max<std::int64_t>(0, applied - step),
                          .why = std::move(why)};
  };
  const CommonState common = common_state(in.survivors, in.zero);
  const StoredStates& stored = in.stored;
  if (common.step)
    return from(stored.group_start == common.step ? RecoverySource::group_start
                                                  : RecoverySource::survivors,
                *common.step, {});
  // The newest state kept elsewhere; in memory first where as new.
  RecoveryChoice best = cannot(common.why);
  const auto consider = [&](RecoverySource source, std::optional<std::int64_t> step) {
    if (step && *step <= applied && (best.source == RecoverySource::none || *step > best.step))
      best = from(source, *step, common.why);
  };
  consider(RecoverySource::group_start, stored.group_start);
  consider(RecoverySource::snapshot, stored.snapshot);
  consider(RecoverySource::checkpoint, stored.checkpoint);
  if (best.source == RecoverySource::none)
    best.why += ", and there is no in-memory snapshot (trainer.snapshot_every) or checkpoint on "
                "disk to recover from";
  return best;
}

// Each worker keeps its batch (the global batch shrinks), or with keep_global_batch the
// accumulation is raised to keep it where the survivors divide its micro-batches.
SurvivorsBatch survivors_batch(int workers, int left, int accumulate_steps, int batch_size,
                               bool keep_global_batch) {
  const int micro_batches = workers * accumulate_steps;
  std::string why;
  if (keep_global_batch && micro_batches % left == 0) {
    accumulate_steps = micro_batches / left;
    why = fmt::format(" (trainer.keep_global_batch: accumulate_steps {})", accumulate_steps);
  } else if (keep_global_batch) {
    why = fmt::format(" (trainer.keep_global_batch: {} micro-batches do not divide among {} "
                      "workers)",
                      micro_batches, left);
  }
  return {.accumulate_steps = accumulate_steps,
          .words = fmt::format("{} samples per step{}", left * accumulate_steps * batch_size, why)};
}

CarriedWindow carried_window(std::span<const std::optional<SurvivorProgress>> survivors,
                             std::int64_t resumed_step) {
  CarriedWindow out;
  const auto first = std::find_if(survivors.begin(), survivors.end(),
                                  [](const auto& p) { return p.has_value(); });
  if (first == survivors.end()) return out;
  out.start_s = (*first)->window_start_s;
  for (const WindowStep& w : (*first)->window)
    if (w.step <= resumed_step) out.agreed.push_back(w);
  // The unagreed step: every survivor's own totals, or none (a survivor that could not report
  // took its samples' totals with it).
  std::optional<WindowStep> sum;
  for (const std::optional<SurvivorProgress>& p : survivors) {
    if (!p || !p->unagreed || (sum && p->unagreed->step != sum->step)) return out;
    const WindowStep& mine = *p->unagreed;
    if (!sum) {
      sum = mine;
      continue;
    }
    sum->loss_sum += mine.loss_sum;
    sum->correct += mine.correct;
    sum->samples += mine.samples;
    sum->counted += mine.counted;
  }
  // A state older than it (a snapshot's) takes the step again; none is newer.
  if (sum->step == resumed_step) out.unagreed = sum;
  return out;
}

}  // namespace lockstep::detail
