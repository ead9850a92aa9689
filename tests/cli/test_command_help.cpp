// Issue 42 item 7: `lockstep COMMAND --help` prints that command's help; `config --print` shows
// every shipped config (data files not made yet, --init-from's model); docs/config.md is what
// `config --schema --markdown` prints.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"

namespace fs = std::filesystem;
using lockstep::test::run_cli;

TEST_CASE("cli: lockstep COMMAND --help prints that command's help") {
  for (const std::string command : {"eval", "export", "sample", "tokenize", "config", "devices"}) {
    CAPTURE(command);
    const auto r = run_cli(command + " --help");
    CHECK(r.code == 0);
    CHECK_MESSAGE(r.output.starts_with("usage: lockstep " + command + " "), r.output);
    CHECK(r.output.find("commands:") == std::string::npos);  // not the whole usage
    CHECK(r.output.find("\n  train CONFIG") == std::string::npos);
  }
  const auto train = run_cli("train -h");
  CHECK(train.output.starts_with("usage: lockstep train CONFIG"));
  CHECK(train.output.find("config keys") != std::string::npos);
  const auto all = run_cli("--help");
  CHECK(all.output.find("commands:") != std::string::npos);
  CHECK(all.output.find("  sample CKPT") != std::string::npos);
}

TEST_CASE("cli: config --print shows every shipped config, --init-from's model included") {
  const lockstep::test::TempDir dir;
  // A GPT checkpoint for the configs whose model comes from the weights.
  const fs::path ckpt = dir.path() / "gpt";
  const auto trained = run_cli("train \"" LOCKSTEP_SOURCE_DIR "/configs/gpt_tiny.yaml\" --set model.context=16 "
                               "--set model.n_layer=1 --set model.d_model=32 --set trainer.steps=1 "
                               "--set trainer.eval_every=0 --set trainer.checkpoint.dir=\"" + ckpt.string() + "\"");
  REQUIRE_MESSAGE(trained.code == 0, trained.output);
  int configs = 0;
  for (const auto& entry : fs::directory_iterator(LOCKSTEP_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++configs;
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    // finetune_cpu.yaml takes its model from --init-from, and its data is made by tokenize later.
    const bool from_weights = name == "finetune_cpu.yaml";
    const auto r = run_cli("config --print \"" + entry.path().string() + "\"" +
                           (from_weights ? " --init-from \"" + ckpt.string() + "\"" : std::string()));
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK(r.output.find("model:\n") != std::string::npos);
    if (from_weights) CHECK(r.output.find("  d_model: 32\n") != std::string::npos);
  }
  CHECK(configs >= 4);
}

TEST_CASE("cli: docs/config.md is what config --schema --markdown prints") {
  const auto r = run_cli("config --schema --markdown");
  REQUIRE(r.code == 0);
  std::ifstream f(LOCKSTEP_SOURCE_DIR "/docs/config.md", std::ios::binary);
  const std::string committed{std::istreambuf_iterator<char>(f), {}};
  CHECK_MESSAGE(committed == r.output,
                "docs/config.md is out of date: regenerate it with "
                "build/lockstep config --schema --markdown > docs/config.md");
  CHECK(r.output.find("| `optimizer.lr` |") != std::string::npos);
}
