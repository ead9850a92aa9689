// The trainer with the GPT model on token windows, against closed-form expectations:
//   - N workers x batch B take the same steps as 1 worker x batch N*B (data-parallel
//     equivalence), in fp32 and in bf16, and replicas stay bit-identical;
//   - loss and accuracy are per token, and the model must fit the data;
//   - a checkpoint carries the architecture for `lockstep sample`.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "../data/temp_files.hpp"
#include "trainer_fixtures.hpp"
#include "common/random.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

using test::token_stream;

Config gpt_config(int devices, int batch) { return test::small_gpt_config(devices, batch); }

}  // namespace

TEST_CASE("gpt: N workers x batch B equal 1 worker x batch N*B, replicas identical") {
  // 8-token windows: 120 of them in 961 tokens, so every global batch of 6 or 12 is full.
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  // Both attention paths (auto would run the materialised one: fp32 at context 8).
  for (const AttentionKind attention : {AttentionKind::fused, AttentionKind::materialized}) {
    for (int n : {2, 3}) {
      CAPTURE(n);
      CAPTURE(to_string(attention));
      const int b = 12 / n;
      Config many_cfg = gpt_config(n, b), one_cfg = gpt_config(1, 12);
      many_cfg.model.attention = one_cfg.model.attention = attention;
      Trainer many(many_cfg, train, eval);
      Trainer one(one_cfg, train, eval);
      const Summary sm = many.run(), so = one.run();
      CHECK(sm.attention == to_string(attention));
      CHECK(sm.replicas_identical);
      CHECK(sm.replica_checks == 11);
      CHECK(sm.parameters == so.parameters);
      CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(1e-4));
      // AdamW divides by sqrt(v): summation order shows a little.
      CHECK(test::relative_difference(many.final_parameters(), one.final_parameters()) <= 1e-4);
      // It learned: a uniform guess over 13 tokens has loss log 13 = 2.56.
      CHECK(so.eval_loss < 2.4);
    }
  }
}

TEST_CASE("gpt bf16: N workers x batch B match 1 worker x batch N*B, replicas identical") {
  // As above under trainer.precision bf16: every sample is rounded the same way whichever
  // worker computes it, so only fp32 summation order differs; rounded weights can differ in a
  // last bf16 bit, hence the looser bound.
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  Config many = gpt_config(2, 6), one = gpt_config(1, 12);
  many.trainer.precision = one.trainer.precision = Precision::bf16;
  const Summary sm = Trainer(many, train, eval).run(), so = Trainer(one, train, eval).run();
  CHECK(sm.attention == "fused");  // auto, on the CPU in bf16
  CHECK(sm.replicas_identical);
  CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(1e-3));
  CHECK(so.eval_loss < 2.4);
}

TEST_CASE("gpt: the summary counts windows, loss is per token, and the data must fit") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  Trainer t(gpt_config(2, 4), train, nullptr);
  const Summary s = t.run();
  CHECK(s.samples == 10 * 2 * 4);  // windows, not tokens
  CHECK(s.final_train_loss < std::log(13.0));
  CHECK(s.final_train_accuracy > 0.0);
  CHECK(s.final_train_accuracy <= 1.0);

  Config wrong = gpt_config(1, 4);
  wrong.model.context = 16;  // the data has 8-token windows
  CHECK_THROWS_WITH_AS(Trainer(wrong, train, nullptr), doctest::Contains("model.context is 16"),
                       InputError);
  wrong = gpt_config(1, 4);
  wrong.model.type = "mlp";
  CHECK_THROWS_WITH_AS(Trainer(wrong, train, nullptr), doctest::Contains("model.type gpt"),
                       InputError);
}

// Summary::step_tokens_per_s is the steady step's rate, the start left out. Worker 0's report of
// each step sleeps in on_progress, 2 s at step 1 and 0.1 s after, so every step's interval holds
// the sleep of the step before: the steps after the first two take 0.1 s and a tiny model's
// compute, their rate at most a step's 64 tokens (2 workers x 4 windows x 8) over 0.1 s; the
// whole run's counts the 2 s too.
TEST_CASE("gpt: the summary's step tokens/s is the steady step's, the whole run's counts its start") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  Trainer t(gpt_config(2, 4), train, nullptr);  // 10 steps
  t.on_progress([](const StepMetrics& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(m.step == 1 ? 2000 : 100));
  });
  const Summary s = t.run();
  const double step_tokens = 2 * 4 * 8;
  CAPTURE(s.step_tokens_per_s);
  CAPTURE(s.tokens_per_s);
  CHECK(s.step_tokens_per_s <= step_tokens / 0.1);
  CHECK(s.step_tokens_per_s >= step_tokens / 0.3);
  CHECK(s.tokens_per_s < 0.7 * s.step_tokens_per_s);
  CHECK(s.step_mfu == 0.0);  // no peak FLOP/s for the CPU
  CHECK(s.to_json().find("\"step_tokens_per_s\": ") != std::string::npos);
}

TEST_CASE("gpt: a checkpoint records the architecture and the tokenizer for sampling") {
  const test::TempDir dir;
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  Config cfg = gpt_config(2, 4);
  cfg.trainer.checkpoint.dir = (dir.path() / "ckpt").string();
  Trainer(cfg, train, nullptr).run();
  const Checkpoint ckpt = CheckpointManager::load(dir.path() / "ckpt");
  const GptSpec spec = parse_gpt_spec(ckpt.metadata.at("lockstep.model"));
  CHECK(spec.vocab_size == 13);
  CHECK(spec.context == 8);
  CHECK(spec.n_layer == 2);
  CHECK(spec.n_head == 2);
  CHECK(spec.d_model == 16);
  CHECK(ckpt.metadata.at("lockstep.tokenizer") == "ids");
  check_layout(ckpt, Model::gpt(spec).param_tensors());
}

// Note [What a resume may change]: model.attention is the same function computed another way,
// and a resume takes the path the config names now. From a checkpoint of 4 steps on the
// materialised path, 4 more on either: the summary names the path taken; the materialised
// resume ends bit-identical to the uninterrupted run, the fused one does not (its online softmax
// rounds elsewhere), yet stays close.
TEST_CASE("gpt: a resume may change model.attention, and the path it names is the one taken") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  Config cfg = gpt_config(1, 6);
  cfg.model.attention = AttentionKind::materialized;
  cfg.trainer.steps = 8;
  Trainer full(cfg, train, nullptr);
  full.run();
  const Checkpoint at4 = test::checkpoint_after(
      cfg, 4, train, fmt::format("lockstep_gpt_attention_resume_{}", getpid()));
  for (const AttentionKind attention : {AttentionKind::materialized, AttentionKind::fused}) {
    CAPTURE(to_string(attention));
    Config c = cfg;
    c.model.attention = attention;
    Trainer resumed(c, train, nullptr);
    resumed.resume_from(at4);
    const std::vector<ConfigChange>& changes = resumed.resume_changes();
    CHECK(std::any_of(changes.begin(), changes.end(), [](const ConfigChange& change) {
            return change.key == "model.attention";
          }) == (attention == AttentionKind::fused));
    const Summary s = resumed.run();
    CHECK(s.attention == to_string(attention));
    const std::vector<float>& mine = resumed.final_parameters();
    const std::vector<float>& reference = full.final_parameters();
    REQUIRE(mine.size() == reference.size());
    CHECK((mine == reference) == (attention == AttentionKind::materialized));
    double largest = 0.0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const double d = std::abs(static_cast<double>(mine[i]) - reference[i]);
      largest = std::isnan(d) ? INFINITY : std::max(largest, d);
    }
    CHECK(largest < 1e-3);
  }
}
