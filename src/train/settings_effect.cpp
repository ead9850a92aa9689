#include "train/settings_effect.hpp"

#include <fmt/format.h>

#include "lockstep/error.hpp"

namespace lockstep::detail {

std::vector<std::string> settings_without_effect(const Config& cfg, std::string_view backend,
                                                 int workers) {
  const TrainerConfig& t = cfg.trainer;
  const TrainerConfig defaults;
  if (t.min_workers > workers)
    throw InputError(fmt::format(
        "{}: trainer.min_workers {} is above the run's {} worker(s): it could never be met "
        "(set it to at most {}, or train on more devices)",
        cfg.source, t.min_workers, workers, workers));
  std::vector<std::string> out;
  const auto without = [&](std::string_view key, std::string_view value, std::string_view why) {
    out.push_back(fmt::format("{}: {}: {}; the run goes on without it", key, value, why));
  };
  if (backend == "cpu") {
    if (t.cuda_graphs == GraphMode::on)
      without("trainer.cuda_graphs", "on", "CUDA graphs run on the cuda backend only, and this "
                                           "run is on the cpu");
    if (t.comm != defaults.comm)
      without("trainer.comm", to_string(t.comm),
              "a CUDA communicator; the cpu backend has its own");
  } else if (t.threads_per_device != defaults.threads_per_device) {
    without("trainer.threads_per_device", std::to_string(t.threads_per_device),
            fmt::format("sizes the cpu backend's thread pools; this run is on {}", backend));
  }
  if (t.on_worker_failure != WorkerFailurePolicy::shrink) {
    const auto shrink_only = [&](std::string_view key, bool set, std::string value) {
      if (set)
        without(key, value, "applies to trainer.on_worker_failure: shrink, and this run stops "
                            "on a lost worker");
    };
    shrink_only("trainer.min_workers", t.min_workers != defaults.min_workers,
                std::to_string(t.min_workers));
    shrink_only("trainer.keep_global_batch", t.keep_global_batch != defaults.keep_global_batch,
                "true");
    shrink_only("trainer.snapshot_every", t.snapshot_every != defaults.snapshot_every,
                std::to_string(t.snapshot_every));
  }
  return out;
}

}  // namespace lockstep::detail
