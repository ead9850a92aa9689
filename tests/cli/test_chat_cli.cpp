// `lockstep train` on conversations: configs/sft_tiny.yaml trains a few steps on the shipped
// chat file, packed, and the summary counts the loss's tokens; a bad record exits 2 naming its
// file and line, or is skipped and counted under data.skip_bad_records.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"

using lockstep::test::run_cli;

namespace {

const std::string kConfig = "\"" LOCKSTEP_SOURCE_DIR "/configs/sft_tiny.yaml\"";

}  // namespace

TEST_CASE("cli: configs/sft_tiny.yaml fine-tunes on the shipped conversations, packed") {
  const lockstep::test::TempDir dir;
  const auto summary = dir.path() / "summary.json";
  const auto r = run_cli("train " + kConfig +
                         " --set trainer.steps=4 --set trainer.eval_every=4 --set "
                         "trainer.log_every=2 --summary-json \"" + summary.string() + "\"");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find("loss tokens/s") != std::string::npos);
  const std::string json = lockstep::test::read_text(summary);
  CHECK(lockstep::test::json_number(json, "skipped_records") == 0);
  CHECK(lockstep::test::json_number(json, "loss_tokens") > 0);
  CHECK(lockstep::test::json_number(json, "eval_loss") > 0);
}

TEST_CASE("cli: a bad conversation exits 2 naming its file and line, or is skipped and counted") {
  const lockstep::test::TempDir dir;
  const std::string good = R"({"prompt": "What is 2 plus 2?", "response": "4."})";
  const auto file = dir.write("chat.jsonl", good + "\n" + good + "\n" +
                                                R"({"messages": [{"role": "robot", "content": "x"}]})" +
                                                "\n" + good + "\n");
  const std::string set = " --set data.path=\"" + file.string() +
                          "\" --set data.eval_fraction=0 --set trainer.steps=2 "
                          "--set data.batch_size=1 --set trainer.eval_every=0";
  const auto bad = run_cli("train " + kConfig + set);
  CHECK(bad.code == 2);
  CHECK_MESSAGE(bad.output.find(file.string() + ":3: ") != std::string::npos, bad.output);
  CHECK(bad.output.find("unknown role 'robot'") != std::string::npos);
  const auto summary = dir.path() / "summary.json";
  const auto skipped = run_cli("train " + kConfig + set +
                               " --set data.skip_bad_records=true --summary-json \"" +
                               summary.string() + "\"");
  REQUIRE_MESSAGE(skipped.code == 0, skipped.output);
  CHECK(lockstep::test::json_number(lockstep::test::read_text(summary), "skipped_records") == 1);
}
