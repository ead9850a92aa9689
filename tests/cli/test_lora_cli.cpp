// `lockstep train` with model.lora from the command line (Note [LoRA] in src/model/lora.cpp,
// Note [LoRA exports] in src/io/lora_checkpoint.cpp): a run's base exported (export --base) is
// the base of the next (--init-from), whose adapters export as a PEFT directory that --init-from
// reads back with the base it names; a resume needs the same base and refuses another with exit
// 2, naming both hashes; sample and eval read a LoRA checkpoint with its base. On the Llama
// family's blocks and on GPT-2's.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"

namespace {

using lockstep::test::run_cli;

// configs/llama_tiny.yaml (or gpt_tiny.yaml, GPT-2's blocks) made small, with rank-2 adapters
// on every projection: the config and its settings, for train and eval.
struct Tiny {
  std::string config, settings;
};
const Tiny kLlama{"\"" + std::string(LOCKSTEP_SOURCE_DIR) + "/configs/llama_tiny.yaml\"",
                  " --set model.context=16 --set model.n_layer=1 --set model.d_model=32 "
                  "--set model.intermediate_size=48 --set data.batch_size=4 "
                  "--set model.lora.rank=2 --set model.lora.targets=all "};
const Tiny kGpt2{"\"" + std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml\"",
                 " --set model.context=16 --set model.n_layer=1 --set model.d_model=32 "
                 "--set data.batch_size=4 --set model.lora.rank=2 --set model.lora.targets=all "};

void check_chain(const Tiny& tiny) {
  const std::string kLora = "train " + tiny.config + tiny.settings + "--set trainer.eval_every=0 ";
  const lockstep::test::TempDir dir;
  const auto at = [&](const char* name) { return (dir.path() / name).string(); };
  const auto first = run_cli(kLora + "--set trainer.steps=2 --set trainer.checkpoint.dir=" + at("c1"));
  REQUIRE_MESSAGE(first.code == 0, first.output);
  CHECK(first.output.find("parameters trained (frozen") != std::string::npos);
  for (const std::string& args : {"--format hf --base --out " + at("base"),
                                 "--format hf --out " + at("merged"),
                                 "--format peft --out " + at("peft_seed")}) {
    const auto r = run_cli("export " + at("c1") + " " + args);
    REQUIRE_MESSAGE(r.code == 0, r.output);
  }
  const auto second = run_cli(kLora + "--set trainer.steps=2 --set trainer.checkpoint.dir=" +
                              at("c2") + " --init-from " + at("base"));
  REQUIRE_MESSAGE(second.code == 0, second.output);
  const auto peft = run_cli("export " + at("c2") + " --format peft --out " + at("peft"));
  REQUIRE_MESSAGE(peft.code == 0, peft.output);
  CHECK(lockstep::test::read_text(dir.path() / "peft" / "adapter_config.json")
            .find("\"base_model_name_or_path\": \"" + at("base") + "\"") != std::string::npos);
  const auto third = run_cli(kLora + "--set trainer.steps=1 --set trainer.checkpoint.dir=" +
                             at("c3") + " --init-from " + at("peft"));
  REQUIRE_MESSAGE(third.code == 0, third.output);
  CHECK(third.output.find("adapters from " + at("peft")) != std::string::npos);

  // The same base again resumes; the merged weights are another base.
  const std::string more = kLora + "--set trainer.steps=3 --set trainer.checkpoint.dir=" + at("c2");
  const auto other = run_cli(more + " --resume --init-from " + at("merged"));
  CHECK(other.code == 2);
  CHECK_MESSAGE(other.output.find("the adapters were trained on a base with content hash") !=
                    std::string::npos, other.output);
  const auto same = run_cli(more + " --resume --init-from " + at("base"));
  CHECK_MESSAGE(same.code == 0, same.output);
}

void check_sample_and_eval(const Tiny& tiny) {
  const std::string kLora = "train " + tiny.config + tiny.settings + "--set trainer.eval_every=0 ";
  const lockstep::test::TempDir dir;
  const auto at = [&](const char* name) { return (dir.path() / name).string(); };
  const auto first = run_cli(kLora + "--set trainer.steps=1 --set trainer.checkpoint.dir=" + at("c1"));
  REQUIRE_MESSAGE(first.code == 0, first.output);
  const auto base = run_cli("export " + at("c1") + " --format hf --base --out " + at("base"));
  REQUIRE_MESSAGE(base.code == 0, base.output);
  const std::string summary = at("summary.json");
  const auto run = run_cli(kLora + "--set trainer.steps=3 --set trainer.eval_every=3 "
                           "--set trainer.checkpoint.dir=" + at("c2") + " --init-from " +
                           at("base") + " --summary-json " + summary);
  REQUIRE_MESSAGE(run.code == 0, run.output);
  const auto merged = run_cli("export " + at("c2") + " --format hf --out " + at("merged"));
  REQUIRE_MESSAGE(merged.code == 0, merged.output);

  // The checkpoint samples (configs/sft_lora_tiny.yaml's test finds it drawing what its merged
  // export draws; this byte model's export has no tokenizer to sample with).
  const std::string draw = " --prompt \"All the world\" --tokens 12 --temperature 0";
  const auto from_lora = run_cli("sample " + at("c2") + draw);
  REQUIRE_MESSAGE(from_lora.code == 0, from_lora.output);
  CHECK(from_lora.output.starts_with("All the world"));

  // eval's loss is the run's last eval loss: the merged model computes the adapted model's
  // function (to fp32 rounding; Note [LoRA exports]).
  const std::string eval = "eval " + tiny.config + tiny.settings + "--checkpoint " + at("c2");
  const auto evaluated = run_cli(eval);
  REQUIRE_MESSAGE(evaluated.code == 0, evaluated.output);
  const std::size_t loss_at = evaluated.output.find("eval loss ");
  REQUIRE_MESSAGE(loss_at != std::string::npos, evaluated.output);
  const double loss = std::stod(evaluated.output.substr(loss_at + 10));
  const double trained = lockstep::test::json_number(lockstep::test::read_text(summary), "eval_loss");
  CHECK(loss == doctest::Approx(trained).epsilon(1e-5));

  // Another base where the run's was: refused, naming both hashes and what sample needs.
  std::filesystem::rename(dir.path() / "base", dir.path() / "base_moved");
  std::filesystem::rename(dir.path() / "merged", dir.path() / "base");
  for (const std::string& command : {"sample " + at("c2") + draw, eval}) {
    const auto other = run_cli(command);
    CHECK(other.code == 2);
    CHECK_MESSAGE(other.output.find("the adapters were trained on a base with content hash") !=
                      std::string::npos, other.output);
  }
  const auto changed = run_cli("sample " + at("c2") + draw);
  CHECK_MESSAGE(changed.output.find("sample needs that base there") != std::string::npos,
                changed.output);
  // No base there at all: refused, naming the hash and the path it was read from.
  std::filesystem::remove_all(dir.path() / "base");
  const auto gone = run_cli("sample " + at("c2") + draw);
  CHECK(gone.code == 2);
  CHECK_MESSAGE(gone.output.find("it reads the base (content hash") != std::string::npos,
                gone.output);
  CHECK_MESSAGE(gone.output.find(at("base")) != std::string::npos, gone.output);
}

}  // namespace

TEST_CASE("cli: LoRA runs chain through export --base and --format peft, and a resume on another base exits 2") {
  check_chain(kLlama);
}

TEST_CASE("cli: sample and eval run a LoRA checkpoint on its base, and exit 2 when the base is gone or changed") {
  check_sample_and_eval(kLlama);
}

// GPT-2's blocks (c_attn, attn.c_proj, c_fc, mlp.c_proj), the Hugging Face export's Conv1D layout.
TEST_CASE("cli: LoRA on GPT-2 chains through export --base and --format peft, resumes, and refuses another base") {
  check_chain(kGpt2);
}

TEST_CASE("cli: sample and eval run a GPT-2 LoRA checkpoint on its base") {
  check_sample_and_eval(kGpt2);
}
