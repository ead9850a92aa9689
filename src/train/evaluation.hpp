// Loss and accuracy of a replica over a dataset: the trainer's eval (split over the workers, the
// totals summed by a host all-reduce) and lockstep::evaluate (one device, all of it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "lockstep/dataset.hpp"
#include "lockstep/model.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep::detail {

// Summed over samples; a host all-reduce sums them over workers as fields().
struct LossTotals {
  double loss_sum = 0.0;
  double correct = 0.0;
  double predictions = 0.0;  // the labels that count: samples x targets unless masked
  double samples = 0.0;

  std::array<double, 4> fields() const { return {loss_sum, correct, predictions, samples}; }
  static LossTotals from(std::span<const double, 4> f) { return {f[0], f[1], f[2], f[3]}; }
};

// The totals of `replica` over samples first, first + stride, ... of `data`, in batches of at
// most `batch` (the replica's capacity). `after_batch`, if set, is called after each batch (the
// trainer's watchdog sees a long eval progress).
LossTotals loss_totals(Replica& replica, const Dataset& data, std::size_t first,
                       std::size_t stride, int batch,
                       const std::function<void()>& after_batch = {});

// Loss and accuracy are per prediction that counts: per sample, or per token for a language
// model (not kIgnoreLabel's). NaN without predictions.
EvalMetrics eval_metrics(const LossTotals& totals, std::int64_t step);

}  // namespace lockstep::detail
