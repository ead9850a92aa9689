// `lockstep sample` as a library call (CheckpointSampler, sample() in lockstep/generate.hpp):
// the pieces it reports are what the CLI prints for the same request, its tokens are
// generate()'s, and bad options throw InputError named as the caller spells them.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../cli/cli_runner.hpp"
#include "../io/checkpoint_fixtures.hpp"
#include "../text/vocab_files.hpp"
#include "lockstep/device.hpp"
#include "lockstep/generate.hpp"
#include "lockstep/tokenizer.hpp"

namespace {

using lockstep::GptSpec;
using lockstep::SampleRequest;
using lockstep::SampleResult;
using lockstep::test::input_error_of;

constexpr GptSpec kBytes{.vocab_size = 256, .context = 8, .n_layer = 1, .n_head = 2, .d_model = 16};
constexpr GptSpec kIds{.vocab_size = 11, .context = 6, .n_layer = 1, .n_head = 2, .d_model = 16};

// What `lockstep sample` prints for `request` (the flags it has; seed and temperature given).
std::string cli_output(const SampleRequest& r) {
  const lockstep::test::CliResult cli = lockstep::test::run_cli(
      "sample --checkpoint '" + r.checkpoint.string() + "' --prompt '" + r.prompt + "' --tokens " +
      std::to_string(r.options.tokens) + " --temperature " + std::to_string(r.options.temperature) +
      " --seed " + std::to_string(r.options.seed) + " --backend cpu" +
      (r.tokenizer.empty() ? "" : " --tokenizer '" + r.tokenizer.string() + "'"));
  REQUIRE_MESSAGE(cli.code == 0, cli.output);
  return cli.output;
}

// The result, checked against what on_token saw and what generate() draws for its prompt.
SampleResult sample_checked(const SampleRequest& request, const GptSpec& spec) {
  std::vector<int> seen;
  std::string pieces;
  const SampleResult r = lockstep::sample(request, [&](int token, std::string_view piece) {
    seen.push_back(token);
    pieces += piece;
  });
  CHECK(seen == r.tokens);
  CHECK(pieces == r.text);
  CHECK(r.tokens.size() == static_cast<std::size_t>(request.options.tokens));

  const lockstep::Checkpoint ckpt = lockstep::CheckpointManager::load(request.checkpoint);
  const lockstep::Model model = lockstep::Model::gpt(spec);
  auto dev = lockstep::make_cpu_device(0, 1);
  lockstep::Replica replica(*dev, model, 1);
  replica.load_parameters(ckpt.params);
  CHECK(lockstep::generate(replica, r.prompt_tokens, request.options) == r.tokens);
  return r;
}

}  // namespace

TEST_SUITE("generate") {
  TEST_CASE("sample: a byte model's text, as the CLI prints it for the same seed") {
    const lockstep::test::TempDir dir;
    const SampleRequest request{
        .checkpoint = lockstep::test::save_gpt_checkpoint(dir.path() / "ckpt", kBytes, "bytes"),
        .prompt = "To be",
        .options = {.tokens = 12, .temperature = 1.0, .seed = 3},
        .backend = lockstep::BackendKind::cpu};
    const SampleResult r = sample_checked(request, kBytes);
    CHECK(r.text_model);
    CHECK(r.prompt_tokens == std::vector<int>{'T', 'o', ' ', 'b', 'e'});
    CHECK(r.prompt_text == "To be");
    REQUIRE(r.text.size() == r.tokens.size());
    for (std::size_t i = 0; i < r.tokens.size(); ++i)
      CHECK(static_cast<unsigned char>(r.text[i]) == r.tokens[i]);
    CHECK(cli_output(request) == r.prompt_text + r.text + "\n");

    // A CheckpointSampler shows the prompt before the first draw, and each run is the same.
    lockstep::CheckpointSampler sampler(request);
    CHECK(sampler.prompt_text() == "To be");
    CHECK(sampler.run().tokens == r.tokens);
    CHECK(sampler.run().text == r.text);
  }

  TEST_CASE("sample: a token model's ids, as the CLI prints them for the same seed") {
    const lockstep::test::TempDir dir;
    SampleRequest request{
        .checkpoint = lockstep::test::save_gpt_checkpoint(dir.path() / "ckpt", kIds, "ids"),
        .prompt = "3, 4 10",
        .options = {.tokens = 9, .temperature = 1.0, .seed = 5},
        .backend = lockstep::BackendKind::cpu};
    const SampleResult r = sample_checked(request, kIds);
    CHECK_FALSE(r.text_model);
    CHECK(r.prompt_tokens == std::vector<int>{3, 4, 10});
    CHECK(r.prompt_text == "3 4 10");
    std::string ids;
    for (const int t : r.tokens) ids += fmt::format(" {}", t);
    CHECK(r.text == ids);
    CHECK(cli_output(request) == r.prompt_text + r.text + "\n");
    request.prompt = "";  // starts from token 0
    CHECK(lockstep::sample(request).prompt_tokens == std::vector<int>{0});
  }

  TEST_CASE("sample: stops at the end-of-sequence ids the checkpoint records, or at stop_at") {
    const lockstep::test::TempDir dir;
    SampleRequest request{
        .checkpoint = lockstep::test::save_gpt_checkpoint(dir.path() / "plain", kIds, "ids"),
        .prompt = "3 4",
        .options = {.tokens = 12, .temperature = 1.0, .seed = 2},
        .backend = lockstep::BackendKind::cpu};
    const SampleResult all = lockstep::sample(request);
    REQUIRE(all.tokens.size() == 12);
    CHECK_FALSE(all.stopped);
    // The first token drawn that differs from the first: where a recorded eos_token_id stops it.
    const auto eos = std::find_if(all.tokens.begin(), all.tokens.end(),
                                  [&](int t) { return t != all.tokens[0]; });
    REQUIRE(eos != all.tokens.end());
    const std::vector<int> before(all.tokens.begin(), eos);
    lockstep::Checkpoint c = lockstep::test::gpt_checkpoint(kIds, 7);
    c.state.workers = 1;
    c.metadata["lockstep.tokenizer"] = "ids";
    // A list, as Llama 3.1's config.json has; its other id one never drawn, if there is one.
    int unseen = *eos;
    for (int id = 0; id < kIds.vocab_size; ++id)
      if (std::find(all.tokens.begin(), all.tokens.end(), id) == all.tokens.end()) unseen = id;
    c.metadata["lockstep.eos_token_ids"] = fmt::format("[{}, {}]", *eos, unseen);
    lockstep::CheckpointManager(dir.path() / "eos", 0).save(c);
    request.checkpoint = dir.path() / "eos";
    const SampleResult stopped = lockstep::sample(request);
    CHECK(stopped.tokens == before);
    CHECK(stopped.stopped);
    CHECK(lockstep::CheckpointSampler(request).stop_tokens() == std::vector<int>{*eos, unseen});
    CHECK(cli_output(request) == stopped.prompt_text + stopped.text + "\n");
    // stop_at overrides them: none at all, or others.
    request.stop_at = std::vector<int>{};
    CHECK(lockstep::sample(request).tokens == all.tokens);
    const auto cli_none = lockstep::test::run_cli("sample --checkpoint '" + request.checkpoint.string() +
                                                  "' --prompt '3 4' --tokens 12 --temperature 1 --seed 2 "
                                                  "--backend cpu --stop-at none --kv-cache off");
    CHECK(cli_none.output == all.prompt_text + all.text + "\n");
    request.stop_at = std::vector<int>{all.tokens[0]};
    CHECK(lockstep::sample(request).tokens.empty());
    request.stop_at = std::vector<int>{11};
    CHECK(input_error_of([&] { lockstep::sample(request); }).find("stop_at: token 11 is outside") !=
          std::string::npos);
    const auto bad = lockstep::test::run_cli("sample --checkpoint '" + request.checkpoint.string() +
                                             "' --stop-at 3,x");
    CHECK(bad.code == 2);
    CHECK(bad.output.find("--stop-at: expected token ids separated by commas, or none") !=
          std::string::npos);
  }

  TEST_CASE("sample: a token model with a tokenizer reads and writes text, as the CLI does") {
    const lockstep::test::TempDir dir;
    const std::filesystem::path vocab =
        dir.write("hand.tiktoken", lockstep::test::rank_file(lockstep::test::hand_vocab()));
    const lockstep::Tokenizer tokenizer = lockstep::Tokenizer::load(vocab);
    // 4 ids more than the tokenizer's 266, as a padded vocabulary has: they are shown as ids
    // (seed 7 draws one).
    GptSpec spec = kIds;
    spec.vocab_size = static_cast<int>(tokenizer.vocab_size()) + 4;
    SampleRequest request{
        .checkpoint = lockstep::test::save_gpt_checkpoint(dir.path() / "ckpt", spec, "ids"),
        .prompt = "the abcd",
        .options = {.tokens = 24, .temperature = 1.0, .seed = 7},
        .backend = lockstep::BackendKind::cpu,
        .tokenizer = vocab};
    const SampleResult r = sample_checked(request, spec);
    CHECK(r.text_model);
    std::vector<int> encoded;
    for (const lockstep::TokenId id : tokenizer.encode(request.prompt)) encoded.push_back(static_cast<int>(id));
    CHECK(r.prompt_tokens == encoded);
    CHECK(r.prompt_text == request.prompt);
    std::string text;
    for (const int t : r.tokens)
      text += t < static_cast<int>(tokenizer.vocab_size())
                  ? std::string(tokenizer.token_bytes(static_cast<lockstep::TokenId>(t)))
                  : fmt::format(" {}", t);
    CHECK(r.text == text);
    CHECK(std::ranges::any_of(r.tokens, [&](int t) { return t >= static_cast<int>(tokenizer.vocab_size()); }));
    CHECK(cli_output(request) == r.prompt_text + r.text + "\n");
    request.prompt = "";  // starts from <|endoftext|>
    CHECK(lockstep::sample(request).prompt_tokens == std::vector<int>{static_cast<int>(*tokenizer.end_of_text())});
    // A tokenizer that puts a BOS before each sequence (its post-processor's, as Llama 3's does)
    // puts it before the prompt, as its documents were trained.
    std::string merges;
    for (const auto& [l, r] : lockstep::test::hand_vocab().merges)
      merges += (merges.empty() ? "" : ", ") +
                lockstep::test::json_string(lockstep::test::printable_token(l) + " " +
                                            lockstep::test::printable_token(r));
    const std::filesystem::path bos_dir = dir.path() / "bos";
    std::filesystem::create_directories(bos_dir);
    dir.write("bos/tokenizer.json",
              R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}, )"
              R"("added_tokens": [{"id": 265, "content": "<|endoftext|>", "special": true}], )"
              R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": )"
              R"({"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], )"
              R"("special_tokens": {"<s>": {"id": "<s>", "ids": [265], "tokens": ["<s>"]}}}, )"
              R"("model": {"type": "BPE", "vocab": )" +
                  lockstep::test::vocab_json(lockstep::test::hand_vocab()) + ", \"merges\": [" +
                  merges + "]}}");
    request.tokenizer = bos_dir;
    request.prompt = "the";
    CHECK(lockstep::sample(request).prompt_tokens == std::vector<int>{265, 257});
  }

  TEST_CASE("sample: bad options throw InputError naming them as the caller spells them") {
    const lockstep::test::TempDir dir;
    const SampleRequest good{
        .checkpoint = lockstep::test::save_gpt_checkpoint(dir.path() / "ckpt", kIds, "ids"),
        .options = {.tokens = 2},
        .backend = lockstep::BackendKind::cpu};
    const auto message = [&](auto change, lockstep::OptionSpelling spelling) {
      SampleRequest r = good;
      r.spelling = spelling;
      change(r);
      return input_error_of([&] { lockstep::sample(r); });
    };
    using enum lockstep::OptionSpelling;
    const auto tokens = [](SampleRequest& r) { r.options.tokens = -1; };
    const auto top_k = [](SampleRequest& r) { r.options.top_k = -2; };
    const auto temperature = [](SampleRequest& r) { r.options.temperature = -0.5; };
    const auto prompt = [](SampleRequest& r) { r.prompt = "1 11"; };
    const auto no_checkpoint = [](SampleRequest& r) { r.checkpoint.clear(); };
    CHECK(message(tokens, field) == "tokens: expected >= 0, got -1");
    CHECK(message(tokens, flag) == "--tokens: expected >= 0, got -1");
    CHECK(message(top_k, field) == "top_k: expected >= 0, got -2");
    CHECK(message(top_k, flag) == "--top-k: expected >= 0, got -2");
    CHECK(message(temperature, field) == "temperature: expected >= 0, got -0.5");
    CHECK(message(prompt, field) == "prompt: this model reads token ids in [0, 11), got '11'");
    CHECK(message(prompt, flag) == "--prompt: this model reads token ids in [0, 11), got '11'");
    CHECK(message(no_checkpoint, field) == "sample: expected checkpoint CKPT");
    CHECK(message(no_checkpoint, flag) == "sample: expected --checkpoint CKPT");

    const std::filesystem::path mlp = dir.path() / "mlp";
    lockstep::CheckpointManager(mlp, 0).save(
        lockstep::test::make_checkpoint(lockstep::test::small_model(), 2));
    CHECK(message([&](SampleRequest& r) { r.checkpoint = mlp; }, field)
              .find("no lockstep.model in the metadata: not a GPT checkpoint") != std::string::npos);
  }
}
