// `lockstep train` on the GPT config and `lockstep sample` end to end: tokens/s in the log and
// the summary, the checkpoint sampling reads, reproducible text, and bad input exiting 2.
#include <doctest/doctest.h>

#include <string>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"

namespace {

using lockstep::test::run_cli;

const std::string kGptTiny = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
const std::string kQuickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";

}  // namespace

TEST_CASE("cli: gpt_tiny trains, logs tokens/s, and sample continues a prompt from its checkpoint") {
  const lockstep::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  const std::string summary = (dir.path() / "summary.json").string();
  const auto train = run_cli("train \"" + kGptTiny + "\" --set trainer.steps=12 --set trainer.log_every=6 "
                             "--set trainer.eval_every=0 --set model.n_layer=1 --set model.d_model=32 "
                             "--set trainer.checkpoint.dir=" + ckpt + " --summary-json " + summary);
  REQUIRE_MESSAGE(train.code == 0, train.output);
  CHECK(train.output.find("tokens/s") != std::string::npos);
  CHECK(train.output.find("replicas identical  yes") != std::string::npos);
  const std::string json = lockstep::test::read_text(summary);
  // 12 steps x 2 workers x 16 windows of 64 tokens.
  CHECK(lockstep::test::json_number(json, "samples") == 12 * 2 * 16);
  CHECK(lockstep::test::json_number(json, "tokens_per_s") ==
        doctest::Approx(64 * lockstep::test::json_number(json, "samples_per_s")));
  CHECK(lockstep::test::json_number(json, "flops_per_token") > 0);
  CHECK(json.find("\"mfu\": null") != std::string::npos);  // unknown: no peak for a CPU
  // Where the checkpoint went: on the console, one line per checkpoint, and in the JSON.
  const std::string weights = ckpt + "/step_00000012.safetensors";
  CHECK(train.output.find("checkpoint step 12: " + weights + "\n") != std::string::npos);
  CHECK(json.find("\"checkpoint\": \"" + weights + "\"") != std::string::npos);

  const std::string sample = "sample --checkpoint " + ckpt + " --prompt 'ROSALIND.' --tokens 40";
  const auto a = run_cli(sample + " --seed 3");
  REQUIRE_MESSAGE(a.code == 0, a.output);
  CHECK(a.output.rfind("ROSALIND.", 0) == 0);
  CHECK(a.output.size() == std::string("ROSALIND.").size() + 40 + 1);  // and a newline
  CHECK(run_cli(sample + " --seed 3").output == a.output);
  CHECK(run_cli(sample + " --seed 4").output != a.output);
  // The checkpoint as export takes it: positional, the same draws.
  CHECK(run_cli("sample " + ckpt + " --prompt 'ROSALIND.' --tokens 40 --seed 3").output ==
        a.output);
  const auto two = run_cli("sample " + ckpt + "/elsewhere --checkpoint " + ckpt);
  CHECK(two.code == 2);
  CHECK_MESSAGE(two.output.find("sample: two checkpoints, '" + ckpt + "/elsewhere' and "
                                "--checkpoint '" + ckpt + "'; give one") != std::string::npos,
                two.output);
  const auto greedy = run_cli(sample + " --temperature 0 --top-k 5");
  CHECK_MESSAGE(greedy.code == 0, greedy.output);

  for (const std::string bad : {" --temperature -1", " --tokens x", " --top-k -2", " --backend tpu",
                                " --bogus 1", " extra"}) {
    CAPTURE(bad);
    const auto r = run_cli(sample + bad);
    CHECK(r.code == 2);
    CHECK(r.output.find("error:") != std::string::npos);
  }
  const auto none = run_cli("sample --prompt hi");
  CHECK(none.code == 2);
  CHECK(none.output.find("expected --checkpoint") != std::string::npos);
}

TEST_CASE("cli: sample refuses a checkpoint that is not a GPT's") {
  const lockstep::test::TempDir dir;
  const std::string ckpt = (dir.path() / "mlp").string();
  const auto train = run_cli("train \"" + kQuickstart + "\" --set trainer.steps=3 "
                             "--set trainer.checkpoint.dir=" + ckpt);
  REQUIRE_MESSAGE(train.code == 0, train.output);
  const auto r = run_cli("sample --checkpoint " + ckpt);
  CHECK(r.code == 2);
  CHECK(r.output.find("not a GPT checkpoint") != std::string::npos);
}
