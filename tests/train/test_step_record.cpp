// The step record (Note [One read per step] in src/train/step_record.hpp) and host syncs (Note
// [Host syncs] in device.hpp): the CPU device counts them where a GPU waits, a training step
// makes exactly one, its record's read, whatever accumulate_steps, clipping, on_nonfinite,
// trainer.zero and in-memory snapshots; a label outside the classes is bad input.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "train/device_busy.hpp"
#include "trainer_fixtures.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

// What a step may ask of the trainer that could add a wait: accumulation, clipping, skip, ZeRO.
struct Variant {
  const char* name;
  int accumulate = 1;
  double clip = 0.0;
  NonfinitePolicy policy = NonfinitePolicy::stop;
  int zero = 0;
  int snapshot_every = 0;  // with on_worker_failure: shrink (Note [Snapshots])
};

const Variant kVariants[] = {
    {"plain"},
    {"accumulate 3", 3},
    {"clip 1.0", 1, 1.0},
    {"skip", 1, 0.0, NonfinitePolicy::skip},
    {"accumulate 3, clip 1.0, skip", 3, 1.0, NonfinitePolicy::skip},
    {"ZeRO-1, clip 1.0, skip", 1, 1.0, NonfinitePolicy::skip, 1},
    {"snapshots every step", 1, 0.0, NonfinitePolicy::stop, 0, 1},
    {"ZeRO-1, snapshots every 2 steps", 1, 0.0, NonfinitePolicy::stop, 1, 2},
};

void apply(const Variant& v, Config& cfg) {
  cfg.trainer.accumulate_steps = v.accumulate;
  cfg.optimizer.clip_grad_norm = v.clip;
  cfg.trainer.on_nonfinite = v.policy;
  cfg.trainer.zero = v.zero;
  if (v.snapshot_every > 0) {
    cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
    cfg.trainer.snapshot_every = v.snapshot_every;
  }
  // Eval and replica checks close steps too, and are not counted.
  cfg.trainer.eval_every = 2;
  cfg.trainer.check_replicas_every = 2;
}

// The synthetic data, with sample `bad` labelled `label` (a user's Dataset gone wrong).
class BadLabel final : public Dataset {
 public:
  BadLabel(std::size_t bad, std::int32_t label)
      : data_(make_synthetic(64, 10, 3, 1)), bad_(bad), label_(label) {}
  std::size_t size() const noexcept override { return data_.size(); }
  int features() const noexcept override { return data_.features(); }
  int classes() const noexcept override { return data_.classes(); }
  void get(std::size_t i, float* x, std::int32_t* y) const override {
    data_.get(i, x, y);
    if (i == bad_) *y = label_;
  }

 private:
  InMemoryDataset data_;
  std::size_t bad_;
  std::int32_t label_;
};

}  // namespace

TEST_CASE("step record: a label outside the classes is bad input, named with its sample") {
  for (std::int32_t label : {3, -1}) {
    CAPTURE(label);
    Config cfg = test::cpu_config(2, 8, /*steps=*/4, /*seed=*/4);
    cfg.data.shuffle = false;
    CHECK_THROWS_WITH_AS(Trainer(cfg, std::make_shared<BadLabel>(13, label), nullptr).run(),
                         doctest::Contains(fmt::format("sample 13: label {} is outside [0, 3)",
                                                       label).c_str()),
                         InputError);
  }
}

TEST_CASE("host syncs: the CPU device counts reads, waits, allocations and frees, not kernels") {
  auto dev = make_cpu_device(0, 1);
  const std::uint64_t start = dev->host_syncs();
  {
    DeviceArray<float> x(*dev, 100);  // 1: allocate
    dev->fill(x.data(), 2.0f, 100);
    dev->scale(x.data(), 0.5f, 100);
    CHECK(dev->host_syncs() == start + 1);
    CHECK(dev->sum_squares(x.data(), 100) == 100.0);  // 2
    (void)dev->hash(x.data(), 100);                     // 3
    (void)x.download();                                 // 4: copy_to_host
    dev->synchronize();                                 // 5
    CHECK(dev->host_syncs() == start + 5);
  }  // 6: deallocate
  CHECK(dev->host_syncs() == start + 6);
}

TEST_CASE("host syncs: one per MLP step, with and without accumulation, clipping, skip, ZeRO-1") {
  auto train = std::make_shared<InMemoryDataset>(make_synthetic(240, 10, 3, 1));
  auto eval = std::make_shared<InMemoryDataset>(make_synthetic(30, 10, 3, 2));
  for (const Variant& v : kVariants) {
    CAPTURE(std::string(v.name));
    Config cfg = test::cpu_config(2, 8, /*steps=*/5, /*seed=*/4);
    cfg.model.hidden = {16};
    apply(v, cfg);
    const Summary s = Trainer(cfg, train, eval).run();
    CHECK(s.steps == 5);
    CHECK(s.host_syncs_per_step == 1);
  }
}

TEST_CASE("host syncs: one per GPT step, with and without accumulation, clipping, skip, ZeRO-1") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(500, 8, 1));
  auto eval = std::make_shared<TokenDataset>(test::token_stream(100, 8, 2));
  for (const Variant& v : kVariants) {
    CAPTURE(std::string(v.name));
    Config cfg = test::small_gpt_config(2, 3);
    cfg.trainer.steps = 4;
    apply(v, cfg);
    const Summary s = Trainer(cfg, train, eval).run();
    CHECK(s.steps == 4);
    CHECK(s.host_syncs_per_step == 1);
    CHECK(s.to_json().find("\"host_syncs_per_step\": 1,") != std::string::npos);
    // The CPU device is its host: no device time of its own (Note [Device step time]).
    CHECK_FALSE(s.device_busy.has_value());
    CHECK(s.to_json().find("\"device_busy\": null,") != std::string::npos);
    // No cuDNN on the CPU backend (on cuda: CudaSupport::cudnn, test_cuda.cpp).
    CHECK(s.to_json().find("\"cudnn\": null,") != std::string::npos);
    // The linear products, counted through the CPU device: composed, every one.
    CHECK(s.fused_linear.composed > 0);
    CHECK(s.fused_linear.fused + s.fused_linear.partial == 0);
    CHECK(s.to_json().find(fmt::format("\"fused_linear\": {{\"fused\": 0, \"partial\": 0, "
                                       "\"composed\": {}}}",
                                       s.fused_linear.composed)) != std::string::npos);
  }
}

// Note [Device step time]: the device's time for each step over the host's, from one step's
// start to the next, the first step left out, the median of the rest.
TEST_CASE("device busy: the median over steady steps of the device's time over the host's") {
  detail::DeviceBusy busy;
  CHECK_FALSE(busy.median().has_value());
  // Steps start at these host times; the device took these seconds of each.
  const double starts[] = {0.0, 5.0, 6.0, 7.0, 8.0, 12.0, 13.0};
  const double device[] = {4.0, 0.5, 0.9, 0.8, 1.0, 0.7};
  busy.begin_step(1, starts[0]);
  for (int k = 0; k < 6; ++k) {
    busy.step_read(k + 1, device[k]);
    busy.begin_step(k + 2, starts[k + 1]);
  }
  // Steps 2 to 6: 0.5/1, 0.9/1, 0.8/1, 1.0/4, 0.7/1; step 1 (4 of 5 s) is not steady.
  REQUIRE(busy.median().has_value());
  CHECK(*busy.median() == doctest::Approx(0.7));
  // Read while the next step is queued (Note [Deferred step read]): the same fractions.
  detail::DeviceBusy deferred;
  deferred.begin_step(1, starts[0]);
  for (int k = 0; k < 6; ++k) {
    deferred.begin_step(k + 2, starts[k + 1]);
    deferred.step_read(k + 1, device[k]);
  }
  REQUIRE(deferred.median().has_value());
  CHECK(*deferred.median() == doctest::Approx(0.7));
  // A device with no time of its own (the CPU's) adds nothing.
  detail::DeviceBusy cpu;
  for (int k = 0; k < 7; ++k) {
    cpu.begin_step(k + 1, starts[k]);
    cpu.step_read(k + 1, std::nullopt);
  }
  CHECK_FALSE(cpu.median().has_value());
}
