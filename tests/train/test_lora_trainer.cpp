// The trainer with LoRA adapters (Note [LoRA], Note [Frozen parameters] in src/model/lora.cpp):
// N workers x batch B take the steps of 1 worker x batch N*B with identical replicas, ZeRO and
// accumulation on the adapters alone; the summary's trainable and frozen counts against a full
// fine-tune; a resume is bit-exact on the same base and refused on another, naming both hashes;
// the exports (merged, base, PEFT) read back; with dropout on the adapters' input (Note [LoRA
// dropout]) a resume and recompute full stay bit-exact and eval drops nothing; under bf16 (the
// base in bf16 only) the same, within bf16's tolerance of fp32.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "io/peft.hpp"
#include "train/evaluation.hpp"
#include "train/memory_plan.hpp"
#include "trainer_fixtures.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

using test::token_stream;

// On the Llama family's blocks, or (gpt2) GPT-2's.
Config lora_config(int devices, int batch, bool gpt2 = false) {
  Config cfg = gpt2 ? test::small_gpt_config(devices, batch)
                    : test::small_llama_config(devices, batch);
  cfg.model.lora = {.rank = 4, .alpha = 8.0, .targets = "all"};
  cfg.optimizer.type = OptimizerKind::adamw;
  cfg.optimizer.lr = 0.01;
  cfg.trainer.steps = 6;
  return cfg;
}

// `whole`, the final adapters of a run of `cfg` (with dropout), against: the run without dropout
// (the masks changed the steps), the run stopped at step 3 into `dir` and resumed (the same
// masks for the same steps, Note [LoRA dropout]), and with trainer.recompute full (each block's
// forward rerun with the same key: the same masks) and selective (res1 through o_proj and its
// adapters with the same masks, the norms and SwiGLU rerun on what forward kept), the last
// three bit for bit.
void check_dropout_runs(const Config& cfg, const std::shared_ptr<TokenDataset>& train,
                        const std::filesystem::path& dir, const std::vector<float>& whole) {
  Config plain = cfg;
  plain.model.lora.dropout = 0.0;
  Trainer undropped(plain, train, nullptr);
  undropped.run();
  CHECK(undropped.final_parameters() != whole);
  Config first = cfg;
  first.trainer.steps = 3;
  first.trainer.checkpoint.dir = dir.string();
  Trainer(first, train, nullptr).run();
  Trainer resumed(cfg, train, nullptr);
  resumed.resume_from(*CheckpointManager(dir, 0).load_latest());
  resumed.run();
  CHECK(resumed.final_parameters() == whole);
  for (const Recompute recompute : {Recompute::full, Recompute::selective}) {
    CAPTURE(to_string(recompute));
    Config recomputed = cfg;
    recomputed.trainer.recompute = recompute;
    Trainer again(recomputed, train, nullptr);
    again.run();
    CHECK(again.final_parameters() == whole);
  }
}

void check_many_as_one(bool gpt2) {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  Config many_cfg = lora_config(3, 2, gpt2), one_cfg = lora_config(1, 12, gpt2);
  many_cfg.trainer.zero = 2;
  many_cfg.trainer.accumulate_steps = 2;
  many_cfg.optimizer.clip_grad_norm = one_cfg.optimizer.clip_grad_norm = 0.5;
  Trainer many(many_cfg, train, eval);
  Trainer one(one_cfg, train, eval);
  const Summary sm = many.run(), so = one.run();
  CHECK(sm.replicas_identical);
  const Model& model = one.model();
  CHECK(so.parameters == model.param_count());
  CHECK(test::relative_difference(many.final_parameters(), one.final_parameters()) <= 1e-4);
  CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(1e-4));
  // The adapters moved: B started at zero.
  CHECK(one.final_parameters() != model.initial_parameters(one_cfg.trainer.seed));
  // Only the adapters are trained; the full fine-tune trains every weight of the same model.
  CHECK(so.training.trainable_parameters == model.param_count());
  CHECK(so.training.frozen_parameters == model.frozen_count());
  CHECK(so.training.gradient_bytes_per_step == 4 * model.param_count());
  CHECK(so.training.optimizer_state_bytes == 8 * model.param_count());  // AdamW: m and v
  REQUIRE(so.full_finetune);
  CHECK(so.full_finetune->trainable_parameters == model.frozen_count());
  CHECK(so.full_finetune->gradient_bytes_per_step == 4 * model.frozen_count());
  CHECK(so.full_finetune->optimizer_state_bytes == 8 * model.frozen_count());
  CHECK(so.to_json().find("\"full_finetune\": {\"trainable_parameters\"") != std::string::npos);
  CHECK(!describe_training_cost(so).empty());
}

// A run, stopped at step 3 and resumed, is the run; another base is refused; the exports read
// back (merged W + s B A, the base alone, the adapters as PEFT's).
void check_resume_and_exports(bool gpt2) {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  const std::filesystem::path dir =
      test::fresh_dir(fmt::format("lockstep_lora_resume_{}_{}", gpt2, getpid()));
  Config cfg = lora_config(2, 3, gpt2);
  cfg.trainer.steps = 6;
  Trainer full(cfg, train, nullptr);
  full.run();
  Config first = cfg;
  first.trainer.steps = 3;
  first.trainer.checkpoint.dir = dir.string();
  Trainer(first, train, nullptr).run();
  const Checkpoint at3 = *CheckpointManager(dir, 0).load_latest();
  const Model& model = full.model();
  const std::vector<float> base = model.initial_frozen(cfg.trainer.seed);
  CHECK(at3.metadata.at("lockstep.lora_base") == base_hash(base));
  CHECK(at3.metadata.at("lockstep.lora_base_source") == fmt::format("seed={}", cfg.trainer.seed));
  CHECK(at3.params.size() == model.param_count());  // the adapters alone
  Trainer resumed(cfg, train, nullptr);
  resumed.resume_from(at3);
  resumed.run();
  CHECK(resumed.final_parameters() == full.final_parameters());

  std::vector<float> other = base;
  other[0] += 1.0f;
  Trainer elsewhere(cfg, train, nullptr);
  elsewhere.resume_from(at3);
  elsewhere.init_from({.params = other, .metadata = {}, .file = "other.safetensors"});
  const std::string both =
      fmt::format("content hash {}, this run's base has {}", base_hash(base), base_hash(other));
  CHECK_THROWS_WITH_AS(elsewhere.run(), doctest::Contains(both.c_str()), InputError);

  // Exports: merged (W + s B A), the base alone, and the adapters as PEFT's.
  const LoraSpec lora = lora_spec(cfg.model);
  const Model plain = Model::gpt(parse_gpt_spec(at3.metadata.at("lockstep.model")));
  const std::filesystem::path merged = dir / "merged", base_dir = dir / "base", peft = dir / "peft";
  export_checkpoint({.checkpoint = dir, .out = merged, .format = "hf"});
  export_checkpoint({.checkpoint = dir, .out = base_dir, .format = "hf", .base = true});
  export_checkpoint({.checkpoint = dir, .out = peft, .format = "peft"});
  CHECK(load_weights(merged, plain.param_tensors()).params ==
        merge_lora(model, lora, at3.params, base));
  CHECK(load_weights(base_dir, plain.param_tensors()).params == base);
  const detail::PeftAdapter adapter = detail::read_peft_adapter(peft, model.param_tensors());
  CHECK(adapter.adapters == at3.params);
  CHECK(adapter.lora.rank == 4);
  CHECK(adapter.lora.alpha == 8.0);
  CHECK(adapter.lora.targets == lora.targets);
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("lora: N workers x batch B match 1 worker x batch N*B, with ZeRO and accumulation on the adapters") {
  check_many_as_one(false);
}

TEST_CASE("lora: a resume is bit-exact on the same base, refused on another naming both hashes") {
  check_resume_and_exports(false);
}

// GPT-2's blocks (Note [LoRA]): the same trainer, targets c_attn, attn.c_proj, c_fc, mlp.c_proj.
TEST_CASE("lora on GPT-2: N workers x batch B match 1 worker x batch N*B, replicas identical, the summary's counts") {
  check_many_as_one(true);
}

TEST_CASE("lora on GPT-2: a resume is bit-exact, another base refused, the exports read back") {
  check_resume_and_exports(true);
}

TEST_CASE("lora on GPT-2: trainer.recompute full and selective rerun the adapted blocks bit for bit, with dropout") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  const std::filesystem::path dir =
      test::fresh_dir(fmt::format("lockstep_lora_gpt2_dropout_{}", getpid()));
  Config cfg = lora_config(2, 3, true);
  cfg.model.lora.dropout = 0.3;
  Trainer whole(cfg, train, nullptr);
  whole.run();
  check_dropout_runs(cfg, train, dir, whole.final_parameters());
  std::filesystem::remove_all(dir);
}

TEST_CASE("lora: trainer.recompute full reruns the adapted blocks bit for bit") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  Config none = lora_config(2, 3), full = none;
  full.trainer.recompute = Recompute::full;
  Trainer a(none, train, nullptr), b(full, train, nullptr);
  a.run();
  b.run();
  CHECK(a.final_parameters() == b.final_parameters());
}

TEST_CASE("lora dropout: a resume is bit-exact, recompute full bit-identical, eval drops nothing, and the PEFT export says the rate") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  const std::filesystem::path dir =
      test::fresh_dir(fmt::format("lockstep_lora_dropout_{}", getpid()));
  Config cfg = lora_config(2, 3);
  cfg.model.lora.dropout = 0.3;
  cfg.trainer.accumulate_steps = 2;  // two micro-batches, two masks a step
  Trainer whole(cfg, train, nullptr);
  whole.run();
  check_dropout_runs(cfg, train, dir, whole.final_parameters());
  // The PEFT export says the rate, as lora_dropout.
  export_checkpoint({.checkpoint = dir, .out = dir / "peft", .format = "peft"});
  CHECK(detail::read_peft_config(dir / "peft").dropout == 0.3);
  std::filesystem::remove_all(dir);

  // Eval drops nothing, whatever key a training forward left in the replica.
  const Model& model = whole.model();
  auto dev = make_cpu_device(0, 1);
  const auto totals = [&](std::uint64_t key) {
    Replica replica(*dev, model, 2);
    replica.load_parameters(whole.final_parameters());
    replica.load_frozen(model.initial_frozen(cfg.trainer.seed));
    replica.set_dropout_key(key);
    return detail::loss_totals(replica, *eval, 0, 1, 2).loss_sum;
  };
  CHECK(totals(12345) == totals(0));
}

// Under trainer.precision bf16 (Note [Frozen parameters] in src/model/lora.cpp): each worker
// holds the base as bf16 bits alone, the adapters train as any bf16 parameter. On the Llama
// family's blocks, or (gpt2) GPT-2's.
namespace {

void check_bf16(bool gpt2) {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  const auto losses_of = [&](const Config& cfg, std::vector<double>& losses) {
    Trainer t(cfg, train, eval);
    t.on_step([&](const StepMetrics& m) { losses.push_back(m.loss); });
    t.run();
    return t.final_parameters();
  };
  Config fp32 = lora_config(1, 6, gpt2);
  fp32.trainer.log_every = 1;  // a loss each step
  Config bf16 = fp32;
  bf16.trainer.precision = Precision::bf16;
  std::vector<double> lf, lb;
  const std::vector<float> pf = losses_of(fp32, lf), pb = losses_of(bf16, lb);
  REQUIRE(lf.size() == lb.size());
  REQUIRE(lf.size() == 6);
  for (std::size_t i = 0; i < lf.size(); ++i) {
    CAPTURE(i);
    CHECK(lb[i] == doctest::Approx(lf[i]).epsilon(2e-2));
  }
  CHECK(lb != lf);  // the bf16 path was taken
  CHECK(pb != pf);
  // (Not the parameters: AdamW moves B, which starts at zero, by about lr a step in the sign of
  // its gradient, so an element whose gradient is near zero ends elsewhere from any rounding.)

  // N x B against 1 x N*B: the same losses to bf16's rounding of the sums' order.
  Config many = lora_config(3, 2, gpt2);
  many.trainer.log_every = 1;
  many.trainer.precision = Precision::bf16;
  many.trainer.zero = 2;
  std::vector<double> lm;
  Trainer m(many, train, eval);
  m.on_step([&](const StepMetrics& s) { lm.push_back(s.loss); });
  const Summary sm = m.run();
  CHECK(sm.replicas_identical);
  REQUIRE(lm.size() == lb.size());
  for (std::size_t i = 0; i < lm.size(); ++i) {
    CAPTURE(i);
    CHECK(lm[i] == doctest::Approx(lb[i]).epsilon(1e-2));
  }

  // Resume bit-exact and recompute full bit-identical, with dropout on the adapters' input.
  const std::filesystem::path dir = test::fresh_dir(fmt::format("lockstep_lora_bf16_{}_{}", gpt2, getpid()));
  Config cfg = lora_config(2, 3, gpt2);
  cfg.trainer.precision = Precision::bf16;
  cfg.model.lora.dropout = 0.3;
  Trainer whole(cfg, train, nullptr);
  whole.run();
  check_dropout_runs(cfg, train, dir, whole.final_parameters());
  const Checkpoint at3 = *CheckpointManager(dir, 0).load_latest();

  // The checkpoint holds the adapters' fp32 masters and the hash of the fp32 base; the exports
  // merge them into the base from its source, in fp32.
  const Model& model = whole.model();
  const std::vector<float> base = model.initial_frozen(cfg.trainer.seed);
  CHECK(at3.params.size() == model.param_count());
  CHECK(at3.metadata.at("lockstep.lora_base") == base_hash(base));
  const Model full = Model::gpt(parse_gpt_spec(at3.metadata.at("lockstep.model")));
  export_checkpoint({.checkpoint = dir, .out = dir / "merged", .format = "hf"});
  export_checkpoint({.checkpoint = dir, .out = dir / "peft", .format = "peft"});
  CHECK(load_weights(dir / "merged", full.param_tensors()).params ==
        merge_lora(model, lora_spec(cfg.model), at3.params, base));
  CHECK(detail::read_peft_adapter(dir / "peft", model.param_tensors()).adapters == at3.params);
  std::filesystem::remove_all(dir);

  // The memory plan: the frozen base at 2 bytes a value under bf16, 4 under fp32.
  const auto plan = [&](Precision precision) {
    Config c = lora_config(1, 6, gpt2);
    c.trainer.precision = precision;
    return detail::plan_memory(c, model, *train, nullptr, true, 1);
  };
  CHECK(plan(Precision::bf16).frozen == 2.0 * double(model.frozen_count()));
  CHECK(plan(Precision::fp32).frozen == 4.0 * double(model.frozen_count()));
}

}  // namespace

TEST_CASE("lora under bf16: losses within bf16's tolerance of fp32's, N x B as 1 x N*B, resume bit-exact, recompute full bit-identical, dropout, exports, and the plan's frozen bytes at 2 a value") {
  check_bf16(false);
}

// GPT-2's: wte and wpe looked up from bf16, the LayerNorms' weights and biases and the blocks'
// biases widened from bf16.
TEST_CASE("lora on GPT-2 under bf16: losses within bf16's tolerance of fp32's, N x B as 1 x N*B, resume bit-exact, recompute full and selective bit-identical, dropout, exports, the plan's frozen bytes at 2 a value") {
  check_bf16(true);
}
