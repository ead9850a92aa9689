// configs/sft_lora_tiny.yaml: LoRA on the shipped conversations, packed (Note [LoRA] in
// src/model/lora.cpp); a few steps of it, then `sample --allow-special` on its merged export (a
// Hugging Face directory) and on the checkpoint, whose chat-template prompt must encode
// <|im_start|> and <|im_end|> as the special tokens they are.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"
#include "lockstep/lockstep.hpp"

using lockstep::test::run_cli;

TEST_CASE("cli: configs/sft_lora_tiny.yaml trains only the adapters, and sample --allow-special") {
  const lockstep::test::TempDir dir;
  const auto summary = dir.path() / "summary.json";
  const auto checkpoints = dir.path() / "ckpt";
  const auto r = run_cli("train \"" LOCKSTEP_SOURCE_DIR "/configs/sft_lora_tiny.yaml\" "
                         "--set trainer.steps=4 --set trainer.eval_every=4 --set trainer.log_every=2 "
                         "--set trainer.checkpoint.dir=\"" + checkpoints.string() +
                         "\" --summary-json \"" + summary.string() + "\"");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string json = lockstep::test::read_text(summary);
  // Rank 8 on all seven projections of 2 blocks (d_model 96, kv width 48, MLP 256): per block
  // q and o 8*(96+96), k and v 8*(96+48), gate, up and down 8*(96+256).
  CHECK(lockstep::test::json_number(json, "trainable_parameters") == 2 * (2 * 1536 + 2 * 1152 + 3 * 2816));
  // The frozen base: untied embedding and head (1,031 ids), 2 blocks and the final norm.
  CHECK(lockstep::test::json_number(json, "frozen_parameters") ==
        2 * 1031 * 96 + 2 * (2 * 96 + 2 * 9216 + 2 * 4608 + 3 * 24576) + 96);
  CHECK(lockstep::test::json_number(json, "loss_tokens") > 0);

  const auto merged = dir.path() / "merged";
  const auto exported = run_cli("export \"" + checkpoints.string() + "\" --format hf --out \"" +
                                merged.string() + "\"");
  REQUIRE_MESSAGE(exported.code == 0, exported.output);

  // The prompt as the chatml template renders a user's turn and opens the assistant's.
  const std::string prompt = "<|im_start|>user\nSpell river backwards.<|im_end|>\n<|im_start|>assistant\n";
  const auto count = [&](bool allow_special, int id) {
    const lockstep::CheckpointSampler sampler({.checkpoint = merged, .prompt = prompt,
                                               .backend = lockstep::BackendKind::cpu,
                                               .allow_special = allow_special});
    return std::ranges::count(sampler.prompt_tokens(), id);
  };
  CHECK(count(true, 1025) == 2);  // <|im_start|>
  CHECK(count(true, 1026) == 1);  // <|im_end|>
  CHECK(count(false, 1025) == 0);
  const auto s = run_cli("sample \"" + merged.string() + "\" --allow-special --prompt \"" +
                         prompt + "\" --tokens 4 --temperature 0");
  CHECK_MESSAGE(s.code == 0, s.output);
  // The checkpoint itself samples the same: its base (drawn from the seed) read again, merged.
  const auto lora = run_cli("sample \"" + checkpoints.string() + "\" --allow-special --prompt \"" +
                            prompt + "\" --tokens 4 --temperature 0");
  CHECK_MESSAGE(lora.code == 0, lora.output);
  CHECK(lora.output == s.output);
}
