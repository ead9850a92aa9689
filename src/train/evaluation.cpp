#include "train/evaluation.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "lockstep/device.hpp"
#include "train/step_record.hpp"

namespace lockstep::detail {

LossTotals loss_totals(Replica& replica, const Dataset& data, std::size_t first,
                       std::size_t stride, int batch, const std::function<void()>& after_batch) {
  Device& dev = replica.device();
  const int features = replica.model().inputs(), targets = data.targets();
  const int classes = replica.model().outputs() / targets;
  std::vector<float> x(static_cast<std::size_t>(batch) * features);
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch) * targets);
  DeviceArray<float> xd(dev, x.size());
  DeviceArray<std::int32_t> yd(dev, y.size());
  // Packed data: each batch's positions (Note [Packed windows] in src/data/chat.cpp).
  std::vector<std::int32_t> positions(data.packed() ? x.size() : 0);
  DeviceArray<std::int32_t> positions_d(dev, positions.size());
  DeviceArray<LossStats> stats(dev, 1);  // summed on the device over every batch, read once
  LossTotals totals;
  replica.set_dropout_key(0);  // eval drops nothing (Note [LoRA dropout] in src/model/lora.cpp)
  for (std::size_t i = first; i < data.size();) {
    int rows = 0;
    for (; rows < batch && i < data.size(); ++rows, i += stride) {
      data.get(i, x.data() + static_cast<std::size_t>(rows) * features,
               y.data() + static_cast<std::size_t>(rows) * targets);
      if (!positions.empty())
        data.get_positions(i, positions.data() + static_cast<std::size_t>(rows) * features);
    }
    const std::size_t labels = static_cast<std::size_t>(rows) * targets;
    xd.upload(std::span<const float>(x.data(), static_cast<std::size_t>(rows) * features));
    yd.upload(std::span<const std::int32_t>(y.data(), labels));
    if (!positions.empty()) {
      positions_d.upload(
          std::span<const std::int32_t>(positions.data(), static_cast<std::size_t>(rows) * features));
      replica.set_positions(positions_d.data());
    }
    // An LM head's loss as the step computes it, chunk by chunk without the logits (Note
    // [Chunked classifier] in src/model/lm_head.cpp).
    if (replica.fuses_loss()) {
      replica.forward_hidden(xd.data(), rows);
      replica.head_loss(rows, {.labels = yd.data(), .grad_scale = 0.0f, .stats = stats.data()},
                        /*gradients=*/false);
    } else {
      dev.softmax_cross_entropy(replica.forward(xd.data(), rows), yd.data(), rows * targets,
                                classes, static_cast<float*>(nullptr), 0.0f, stats.data());
    }
    // The labels that count (kIgnoreLabel's do not).
    totals.predictions += static_cast<double>(
        labels - static_cast<std::size_t>(std::count(y.begin(), y.begin() + labels, kIgnoreLabel)));
    totals.samples += rows;
    if (after_batch) after_batch();
  }
  replica.set_positions(nullptr);
  const LossStats s = stats.download().front();
  check_labels(s, classes, "eval data, a batch");
  totals.loss_sum = s.loss_sum;
  totals.correct = static_cast<double>(s.correct);
  return totals;
}

EvalMetrics eval_metrics(const LossTotals& totals, std::int64_t step) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EvalMetrics m;
  m.step = step;
  m.samples = static_cast<std::size_t>(totals.samples);
  m.loss = totals.predictions > 0 ? totals.loss_sum / totals.predictions : nan;
  m.accuracy = totals.predictions > 0 ? totals.correct / totals.predictions : nan;
  return m;
}

}  // namespace lockstep::detail
