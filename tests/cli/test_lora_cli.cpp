// `lockstep train` with model.lora from the command line (Note [LoRA] in src/model/lora.cpp,
// Note [LoRA exports] in src/io/export_checkpoint.cpp): a run's base exported (export --base) is
// the base of the next (--init-from), whose adapters export as a PEFT directory that --init-from
// reads back with the base it names; a resume needs the same base and refuses another with exit
// 2, naming both hashes.
#include <doctest/doctest.h>

#include <string>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"

namespace {

using lockstep::test::run_cli;

// configs/llama_tiny.yaml made small, with rank-2 adapters on every projection.
const std::string kLora = "train \"" + std::string(LOCKSTEP_SOURCE_DIR) +
                          "/configs/llama_tiny.yaml\" --set model.context=16 --set model.n_layer=1 "
                          "--set model.d_model=32 --set model.intermediate_size=48 "
                          "--set data.batch_size=4 --set trainer.eval_every=0 "
                          "--set model.lora.rank=2 --set model.lora.targets=all ";

}  // namespace

TEST_CASE("cli: LoRA runs chain through export --base and --format peft, and a resume on another base exits 2") {
  const lockstep::test::TempDir dir;
  const auto at = [&](const char* name) { return (dir.path() / name).string(); };
  const auto first = run_cli(kLora + "--set trainer.steps=2 --set trainer.checkpoint.dir=" + at("c1"));
  REQUIRE_MESSAGE(first.code == 0, first.output);
  CHECK(first.output.find("parameters trained (frozen") != std::string::npos);
  for (const std::string args : {"--format hf --base --out " + at("base"),
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
