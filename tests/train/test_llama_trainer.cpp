// The trainer with a Llama-family decoder (Note [One decoder]) on token windows, as GPT-2 has
// it (test_gpt_trainer.cpp): N workers x batch B take the steps of 1 worker x batch N*B with
// bit-identical replicas, in fp32 and bf16; a resume ends bit-identical to the uninterrupted
// run, with the optimiser state replicated or sharded (zero 1); the checkpoint records the
// decoder's settings. ZeRO against the replicated optimiser: test_zero.cpp, both families.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "trainer_fixtures.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

using test::token_stream;

}  // namespace

TEST_CASE("llama: N workers x batch B equal 1 worker x batch N*B, replicas identical") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  for (const AttentionKind attention : {AttentionKind::fused, AttentionKind::materialized}) {
    CAPTURE(to_string(attention));
    Config many_cfg = test::small_llama_config(3, 4), one_cfg = test::small_llama_config(1, 12);
    many_cfg.model.attention = one_cfg.model.attention = attention;
    Trainer many(many_cfg, train, eval);
    Trainer one(one_cfg, train, eval);
    const Summary sm = many.run(), so = one.run();
    CHECK(sm.replicas_identical);
    CHECK(sm.parameters == so.parameters);
    CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(1e-4));
    CHECK(test::relative_difference(many.final_parameters(), one.final_parameters()) <= 1e-4);
    CHECK(so.eval_loss < 2.4);  // it learned: uniform over 13 tokens is log 13 = 2.56
  }
}

TEST_CASE("llama bf16: N workers x batch B match 1 worker x batch N*B, replicas identical") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(token_stream(161, 8, 2));
  Config many = test::small_llama_config(2, 6), one = test::small_llama_config(1, 12);
  many.trainer.precision = one.trainer.precision = Precision::bf16;
  many.model.qkv_bias = one.model.qkv_bias = true;  // the bias's bf16 copy in the qkv product
  const Summary sm = Trainer(many, train, eval).run(), so = Trainer(one, train, eval).run();
  CHECK(sm.replicas_identical);
  CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(1e-3));
  CHECK(so.eval_loss < 2.4);
}

TEST_CASE("llama: a resume is bit-exact, with zero 0 and 1, and the checkpoint records the "
          "decoder's settings") {
  auto train = std::make_shared<TokenDataset>(token_stream(961, 8, 1));
  for (const int zero : {0, 1}) {
    CAPTURE(zero);
    Config cfg = test::small_llama_config(2, 3);
    cfg.trainer.steps = 8;
    cfg.trainer.zero = zero;
    Trainer full(cfg, train, nullptr);
    full.run();
    const Checkpoint at4 = test::checkpoint_after(
        cfg, 4, train, fmt::format("lockstep_llama_resume_{}_{}", zero, getpid()));
    const GptSpec spec = parse_gpt_spec(at4.metadata.at("lockstep.model"));
    CHECK(spec.llama_parts());
    CHECK(spec.positions == PositionKind::rope);
    CHECK(spec.hidden_size() == 40);
    CHECK(!spec.tie_embeddings);
    check_layout(at4, Model::gpt(spec).param_tensors());
    Trainer resumed(cfg, train, nullptr);
    resumed.resume_from(at4);
    resumed.run();
    CHECK(resumed.final_parameters() == full.final_parameters());
  }
}
