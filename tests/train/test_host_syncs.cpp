// Host syncs (Note [Host syncs] in device.hpp): the CPU device counts them where a GPU waits, and
// a training step makes exactly one, its record's read (Note [One read per step] in
// src/train/step_record.hpp), whatever accumulate_steps, clipping, on_nonfinite and trainer.zero.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

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
};

const Variant kVariants[] = {
    {"plain"},
    {"accumulate 3", 3},
    {"clip 1.0", 1, 1.0},
    {"skip", 1, 0.0, NonfinitePolicy::skip},
    {"accumulate 3, clip 1.0, skip", 3, 1.0, NonfinitePolicy::skip},
    {"ZeRO-1, clip 1.0, skip", 1, 1.0, NonfinitePolicy::skip, 1},
};

void apply(const Variant& v, Config& cfg) {
  cfg.trainer.accumulate_steps = v.accumulate;
  cfg.optimizer.clip_grad_norm = v.clip;
  cfg.trainer.on_nonfinite = v.policy;
  cfg.trainer.zero = v.zero;
  // Eval and replica checks close steps too, and are not counted.
  cfg.trainer.eval_every = 2;
  cfg.trainer.check_replicas_every = 2;
}

}  // namespace

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
  }
}
