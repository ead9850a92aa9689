// The step record (Note [One read per step] in step_record.hpp), and Device's read-back loss.
#include "train/step_record.hpp"

#include <cstring>
#include <span>
#include <type_traits>

#include <fmt/format.h>

#include "common/elementwise_math.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace detail {
namespace {

constexpr std::size_t kHeaderDoubles = 5;  // sizeof(Header) / sizeof(double)

}  // namespace

StepRecord::StepRecord(Device& device, std::size_t grains, std::size_t buckets)
    : device_(device),
      grains_(grains),
      memory_(device, kHeaderDoubles + grains),
      readback_(device.make_host_readback(kHeaderDoubles * sizeof(double))),
      bucket_controls_(device, buckets) {
  static_assert(sizeof(Header) == kHeaderDoubles * sizeof(double));
  static_assert(alignof(Header) <= alignof(double));
}

double* StepRecord::grain_sums() noexcept { return memory_.data() + kHeaderDoubles; }

// All bits zero is 0.0 for a float as for a double: one fill of the record's floats.
void StepRecord::reset() {
  device_.fill(reinterpret_cast<float*>(memory_.data()), 0.0f, 2 * memory_.size());
}

void StepRecord::start_read() { readback_->start(memory_.data()); }

StepRecord::Host& StepRecord::read() {
  const std::span<const std::byte> bytes = readback_->wait();
  static_assert(std::is_trivially_copyable_v<Header>);
  Header h;
  std::memcpy(static_cast<void*>(&h), bytes.data(), sizeof(h));
  host_.loss = h.loss;
  host_.control = h.control;
  return host_;
}

void check_labels(const LossStats& stats, int classes, std::string_view where) {
  if (stats.label_error == 0) return;
  throw InputError(fmt::format(
      "{}: label {} of row {} is outside the model's classes [0, {}): the data's labels must be "
      "class indices (token ids below the vocabulary size)",
      where, label_error_label(stats.label_error), label_error_row(stats.label_error), classes));
}

}  // namespace detail

LossStats Device::softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                        int classes, float* dlogits, float grad_scale) {
  DeviceArray<LossStats> stats(*this, 1);
  softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats.data());
  const LossStats s = stats.download().front();
  detail::check_labels(s, classes, "softmax_cross_entropy");
  return s;
}

}  // namespace lockstep
