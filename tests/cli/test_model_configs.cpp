// The shipped configs of public models' shapes (configs/smollm2_135m.yaml,
// configs/qwen2_0_5b.yaml, configs/llama3_2_1b.yaml) build exactly those models: `train
// --dry-run` on a token file counts the parameters the Hugging Face checkpoints hold
// (SmolLM2-135M: 134,515,008; Qwen2.5-0.5B: 494,032,768; Llama-3.2-1B: 1,235,814,400), which
// pins every size key, the kv heads, the biases and the tying.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "../data/temp_files.hpp"

namespace {

// An llm.c token file (header: magic 20240520, version 1, count) of `count` small ids.
std::string token_file(std::uint32_t count) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(count);
  std::string bytes(header.size() * 4 + count * 2, '\0');
  std::memcpy(bytes.data(), header.data(), header.size() * 4);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto id = static_cast<std::uint16_t>((i * 7919u) % 30000u);
    std::memcpy(bytes.data() + header.size() * 4 + i * 2, &id, 2);
  }
  return bytes;
}

}  // namespace

TEST_CASE("configs: smollm2_135m, qwen2_0_5b and llama3_2_1b plan the public models' parameter counts") {
  lockstep::test::TempDir dir;
  const std::string tokens = dir.write("tokens.bin", token_file(40000)).string();
  struct Case {
    const char* config;
    const char* parameters;
  };
  for (const Case c : {Case{"smollm2_135m", "training 134515008 parameters"},
                       Case{"qwen2_0_5b", "training 494032768 parameters"},
                       Case{"llama3_2_1b", "training 1235814400 parameters"}}) {
    CAPTURE(c.config);
    const auto r = lockstep::test::run_cli(
        std::string("train \"" LOCKSTEP_SOURCE_DIR "/configs/") + c.config + ".yaml\" --set data.path=" +
        tokens + " --set data.eval_path=" + tokens + " --set trainer.checkpoint.dir= --set "
        "trainer.devices=1 --set trainer.backend=cpu --set data.batch_size=1 --set model.context=256 "
        "--dry-run");  // a plan that fits a small machine: the parameters do not depend on them
    CHECK_MESSAGE(r.output.find(c.parameters) != std::string::npos, r.output);
    // The 1B model's fp32 state (about 20 GiB) may not fit the machine's memory: then the plan
    // refuses it, naming what it needs, after counting the parameters.
    if (std::string(c.config) == "llama3_2_1b" && r.code == 2 &&
        r.output.find("GiB per worker") != std::string::npos)
      continue;
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK_MESSAGE(r.output.find("memory plan: ") != std::string::npos, r.output);
  }
}
