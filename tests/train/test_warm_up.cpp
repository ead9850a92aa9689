// The warm-up before step 1 (Note [Warm-up] in src/train/worker_loop.hpp): on the CPU it makes
// every oneDNN primitive of the step's forward and backward, so step 1 makes none, and it
// changes no result, in fp32 and bf16.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../random_data.hpp"
#include "../skip.hpp"
#include "cpu/cpu_device.hpp"
#include "cpu/matmul.hpp"
#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;

namespace {

// The products of these tests are too small for oneDNN except attention's batches, which always
// go there (Note [CPU matrix products]); with LOCKSTEP_CPU_GEMM=openblas there is nothing to see.
// False (the case skipped) then: the caller returns.
bool onednn_or_skip() {
  if (cpu::gemm_path().library == cpu::GemmLibrary::onednn) return true;
  test::skip(test::Skip::setup,
             "the CPU's products run on OpenBLAS (LOCKSTEP_CPU_GEMM), which has no primitives");
  return false;
}

// The CPU backend with one device, which the test can watch.
class WatchedCpuBackend final : public Backend {
 public:
  std::string_view name() const noexcept override { return "cpu"; }
  std::vector<DeviceInfo> devices() const override { return cpu_->devices(); }
  std::vector<std::unique_ptr<Communicator>> create_communicators(
      std::span<const int> ids, std::shared_ptr<ProcessGroup> processes) override {
    return cpu_->create_communicators(ids, std::move(processes));
  }
  std::unique_ptr<Device> create_device(int id, int workers, int threads) override {
    auto device = cpu_->create_device(id, workers, threads);
    device_ = &dynamic_cast<cpu::CpuDevice&>(*device);
    return device;
  }
  // Read on the worker's thread only, the thread that makes them.
  std::size_t primitives() const { return device_->gemm_primitives(); }

 private:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  cpu::CpuDevice* device_ = nullptr;
};

struct Step1 {
  std::size_t before = 0, after = 0;  // primitives made before step 1's forward, and after it
  std::vector<float> params;          // at the end of the run
};

// A small GPT on one worker, with or without the warm-up.
Step1 train_gpt(Precision precision, bool warm_up) {
  Config cfg = test::small_gpt_config(1, 4);
  cfg.trainer.precision = precision;
  cfg.trainer.steps = 3;
  // The materialised attention's batched products are this small model's oneDNN primitives:
  // its other products, and the tiled attention's (which auto picks in bf16), go to OpenBLAS.
  cfg.model.attention = AttentionKind::materialized;
  auto train = std::make_shared<TokenDataset>(test::token_stream(400, 8, 11));
  auto backend = std::make_shared<WatchedCpuBackend>();
  Trainer trainer(cfg, train, nullptr, nullptr, backend);
  Step1 s;
  TrainerHooks hooks;
  hooks.warm_up = warm_up;
  hooks.before_forward = [&](int, std::int64_t step) {
    if (step == 1) s.before = backend->primitives();
  };
  hooks.after_update = [&](int, std::int64_t step, Replica&) {
    if (step == 1) s.after = backend->primitives();
  };
  trainer.set_hooks(hooks);
  trainer.run();
  s.params = trainer.final_parameters();
  return s;
}

}  // namespace

TEST_CASE("warm-up: step 1 makes no oneDNN primitive, and the run is as without it") {
  if (!onednn_or_skip()) return;
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    const std::string name(to_string(precision));
    CAPTURE(name);
    const Step1 warm = train_gpt(precision, true);
    CHECK(warm.before > 0);
    CHECK(warm.after == warm.before);
    const Step1 cold = train_gpt(precision, false);
    CHECK(cold.before == 0);
    CHECK(cold.after == warm.after);  // the same primitives, made inside step 1
    CHECK(warm.params == cold.params);
  }
}

TEST_CASE("warm-up: Replica::warm_up leaves the parameters, zero gradients and later logits") {
  if (!onednn_or_skip()) return;
  const Model model = Model::gpt({.vocab_size = 13, .context = 8, .n_layer = 1, .n_head = 2,
                                  .d_model = 16});
  const std::vector<float> init = model.initial_parameters(7);
  const int batch = 3;
  std::vector<float> tokens(static_cast<std::size_t>(batch) * model.inputs());
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<float>(i * 7 % 13);
  const std::vector<float> dlogits =
      test::random_floats(static_cast<std::size_t>(batch) * model.outputs(), 5);
  const auto backend = make_cpu_backend();
  // Logits and gradients of one forward and backward on a fresh device, after a warm-up or not.
  const auto step = [&](bool warm_up) {
    const auto device = backend->create_device(0, 1, 1);
    const auto& cpu_device = dynamic_cast<const cpu::CpuDevice&>(*device);
    Replica replica(*device, model, batch, Precision::bf16);
    replica.load_parameters(init);
    DeviceArray<float> x(*device, tokens.size()), dy(*device, dlogits.size());
    x.upload(tokens);
    dy.upload(dlogits);
    if (warm_up) {
      replica.warm_up(batch);
      CHECK(replica.parameters() == init);
      CHECK(replica.gradients() == std::vector<float>(init.size(), 0.0f));
    }
    const std::size_t primitives = cpu_device.gemm_primitives();
    CHECK((primitives > 0) == warm_up);
    const float* logits = replica.forward(x.data(), batch);
    std::vector<float> out(dlogits.size());
    device->copy_to_host(out.data(), logits, out.size() * sizeof(float));
    replica.backward(x.data(), dy.data(), batch);
    if (warm_up) CHECK(cpu_device.gemm_primitives() == primitives);
    return std::pair(out, replica.gradients());
  };
  CHECK(step(true) == step(false));
}
