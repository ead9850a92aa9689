// `lockstep train --init-from`: the weights alone of a checkpoint or an export, at step 0 with a
// fresh optimiser, for fine-tuning; the model keys the config does not set come from the weights,
// those it sets must agree (every disagreement at once); a Hugging Face directory that `export
// --format hf` wrote from a run with a tokenizer carries it; --resume's errors point at
// --init-from.
#include <doctest/doctest.h>

#include <string>

#include <fmt/format.h>

#include "../data/temp_files.hpp"
#include "../text/vocab_files.hpp"
#include "cli_runner.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/tokenizer.hpp"

namespace {

using lockstep::test::run_cli;

const std::string kGptTiny = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
const std::string kShakespeare =
    std::string(LOCKSTEP_SOURCE_DIR) + "/third_party/shakespeare/as_you_like_it.txt";
// A small GPT on the shipped play: 16-token windows, one block of width 32.
const std::string kSmall = "train \"" + kGptTiny + "\" --set model.context=16 --set model.n_layer=1 "
                           "--set model.d_model=32 --set trainer.eval_every=0 ";

// 8 windows of 16 tokens (and one more byte for the last target), every byte in [32, 127).
std::string eight_windows() {
  std::string text;
  for (int i = 0; i < 8 * 16 + 1; ++i) text += static_cast<char>(32 + (i * 37 + i / 7) % 95);
  return text;
}

}  // namespace

TEST_CASE("cli: --init-from fine-tunes: its first loss is the source checkpoint's eval loss") {
  const lockstep::test::TempDir dir;
  const std::string src = (dir.path() / "src").string();
  const auto a = run_cli(kSmall + "--set trainer.steps=20 --set trainer.checkpoint.dir=" + src);
  REQUIRE_MESSAGE(a.code == 0, a.output);

  // Another text, of exactly one global batch (2 workers x 4 windows), as both splits: step 1's
  // loss is the mean over the same 8 windows that eval averages.
  const std::string other = dir.write("other.txt", eight_windows()).string();
  const std::string data = "--set data.path=" + other + " --set data.eval_path=" + other +
                           " --set data.batch_size=4 ";
  const std::string summary = (dir.path() / "summary.json").string();
  const auto tune = run_cli(kSmall + data + "--set trainer.steps=1 --set optimizer.lr=0.001 "
                            "--set trainer.log_every=1 --init-from " + src +
                            " --summary-json " + summary + " --set trainer.checkpoint.dir=" +
                            (dir.path() / "tuned").string());
  REQUIRE_MESSAGE(tune.code == 0, tune.output);
  CHECK(tune.output.find("initialised from " + src + "/step_00000020.safetensors") !=
        std::string::npos);
  CHECK(tune.output.find("step 1/1") != std::string::npos);  // starts at step 0

  const auto eval = run_cli("eval \"" + kGptTiny + "\" --set model.context=16 --set model.n_layer=1 "
                            "--set model.d_model=32 " + data + "--checkpoint " + src);
  REQUIRE_MESSAGE(eval.code == 0, eval.output);
  const std::size_t at = eval.output.find("eval loss ");
  REQUIRE(at != std::string::npos);
  const double eval_loss = std::stod(eval.output.substr(at + 10));
  CHECK(lockstep::test::json_number(lockstep::test::read_text(summary), "final_train_loss") ==
        doctest::Approx(eval_loss).epsilon(1e-5));
}

TEST_CASE("cli: --init-from refuses another model, naming the first difference, and --resume hints "
          "at it") {
  const lockstep::test::TempDir dir;
  const std::string src = (dir.path() / "src").string();
  REQUIRE(run_cli(kSmall + "--set trainer.steps=2 --set trainer.checkpoint.dir=" + src).code == 0);
  const std::string two = "--set trainer.steps=2 --init-from " + src;

  // Every key the config sets against the weights' record, at once, each with its fix.
  const auto other = run_cli(kSmall + "--set model.n_layer=2 --set model.d_model=64 " + two);
  CHECK(other.code == 2);
  CHECK_MESSAGE(other.output.find("the config's model is not the one " + src +
                                  "/step_00000002.safetensors describes:\n"
                                  "  model.n_layer is 2 (--set model.n_layer=2), 1 in the weights: "
                                  "--set model.n_layer=1\n"
                                  "  model.d_model is 64 (--set model.d_model=64), 32 in the "
                                  "weights: --set model.d_model=32") != std::string::npos,
                other.output);

  // An export loads too; --resume cannot take one, and says what to use instead.
  const std::string exported = (dir.path() / "e.safetensors").string();
  REQUIRE(run_cli("export " + src + " --out " + exported).code == 0);
  CHECK(run_cli(kSmall + "--set trainer.steps=1 --init-from " + exported +
                " --set trainer.checkpoint.dir=" + (dir.path() / "tuned").string()).code == 0);
  // (A new lr is a change a resume accepts; a new seed is not.)
  for (const std::string& resume : {"--set trainer.seed=77 --resume " + src, "--resume " + exported}) {
    CAPTURE(resume);
    const auto r = run_cli(kSmall + "--set trainer.steps=3 " + resume);
    CHECK(r.code == 2);
    CHECK(r.output.find("use --init-from") != std::string::npos);
  }
  const auto both = run_cli(kSmall + "--resume " + src + " --init-from " + src);
  CHECK(both.code == 2);
  CHECK(both.output.find("give one or the other") != std::string::npos);
}

TEST_CASE("cli: --init-from a Hugging Face directory with a tokenizer: the model and tokenizer the "
          "config does not set come from it") {
  const lockstep::test::TempDir dir;
  const std::filesystem::path vocab =
      dir.write("small.tiktoken", lockstep::test::rank_file(lockstep::test::hand_vocab()));
  const std::string src = (dir.path() / "src").string(), hf = (dir.path() / "hf").string();
  REQUIRE(run_cli(kSmall + "--set trainer.steps=1 --set data.tokenizer=" + vocab.string() +
                  " --set trainer.checkpoint.dir=" + src).code == 0);
  const auto exported = run_cli("export " + src + " --format hf --out " + hf);
  REQUIRE_MESSAGE(exported.code == 0, exported.output);
  // merges.txt written from the ranks is the same tokenizer; <|endoftext|> is bos and eos.
  const lockstep::Tokenizer ranks = lockstep::Tokenizer::load(vocab);
  CHECK(lockstep::Tokenizer::load(hf).content_hash() == ranks.content_hash());
  const std::string config = lockstep::test::read_text(hf + "/config.json");
  CHECK(config.find("\"eos_token_id\": " + std::to_string(*ranks.end_of_text())) != std::string::npos);
  CHECK(lockstep::test::read_text(hf + "/tokenizer_config.json").find("\"eos_token\": \"<|endoftext|>\"") !=
        std::string::npos);
  // --tokenizer names another one (the run's moved away): a larger vocabulary is not the model's.
  const std::filesystem::path bigger =
      dir.write("big.tiktoken", lockstep::test::rank_file(lockstep::test::random_vocab(300, 1)));
  const auto wrong = run_cli("export " + src + " --format hf --out " + hf + "2 --tokenizer " + bigger.string());
  CHECK(wrong.code == 2);
  CHECK_MESSAGE(wrong.output.find("has content hash") != std::string::npos, wrong.output);

  // The shipped fine-tuning config sets no model key: they come from config.json.
  const std::string finetune = "train \"" LOCKSTEP_SOURCE_DIR "/configs/finetune_cpu.yaml\" --init-from " +
                               hf + " --set data.dataset=text --set data.path=\"" + kShakespeare +
                               "\" --set data.eval_path=null --set trainer.steps=1 "
                               "--set trainer.eval_every=0 --set trainer.checkpoint.dir=" +
                               (dir.path() / "tuned").string();
  const auto tune = run_cli(finetune);
  REQUIRE_MESSAGE(tune.code == 0, tune.output);
  CHECK_MESSAGE(tune.output.find("from " + hf + "/config.json: model.vocab_size " +
                                 std::to_string(ranks.vocab_size()) + ", model.context 16, "
                                 "model.n_layer 1, model.n_head 4, model.d_model 32, data.tokenizer " +
                                 hf + " (the keys the config does not set)") != std::string::npos,
                tune.output);
  // config.json's eos id goes into the run's checkpoints (Note [Hugging Face token ids]).
  const std::string eos_ids = fmt::format("[{}]", *ranks.end_of_text());
  CHECK(lockstep::CheckpointManager::load(dir.path() / "tuned").metadata.at("lockstep.eos_token_ids") == eos_ids);
  const auto text = run_cli("sample --checkpoint " + (dir.path() / "tuned").string() +
                            " --prompt \"abc d\" --tokens 4 --temperature 0");
  REQUIRE_MESSAGE(text.code == 0, text.output);
  CHECK(text.output.starts_with("abc d"));

  const auto other = run_cli(finetune + " --set model.context=32 --set model.n_head=2");
  CHECK(other.code == 2);
  CHECK_MESSAGE(other.output.find("  model.context is 32 (--set model.context=32), 16 in the weights: "
                                  "--set model.context=16\n  model.n_head is 2 (--set model.n_head=2), "
                                  "4 in the weights: --set model.n_head=4") != std::string::npos,
                other.output);
}

TEST_CASE("cli: --init-from says what a wrong path is: text, another kind of model, a folder of "
          "runs") {
  lockstep::test::TempDir dir;
  const std::string root = dir.path().string();
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const std::string runs = root + "/runs", mlp = runs + "/mlp";
  REQUIRE(run_cli("train \"" + quickstart + "\" --set trainer.steps=2 --set trainer.eval_every=0 "
                  "--set trainer.checkpoint.dir=" + mlp).code == 0);
  const std::string notes = root + "/notes.txt";
  std::ofstream(notes) << "My notes, in plain text.\nSecond line.\n";
  const std::string out = " --set trainer.steps=1 --set trainer.checkpoint.dir=" + root + "/out";

  // A text file: said to be text, not a header of 2^61 bytes.
  const auto text = run_cli(kSmall + out + " --init-from " + notes);
  CHECK(text.code == 2);
  CHECK_MESSAGE(text.output.find(notes + ": not a safetensors file: it starts with text (\"My "
                                 "notes, in plain text.\")") != std::string::npos, text.output);
  // An MLP's checkpoint for a GPT: not a GPT checkpoint, as sample says.
  const auto other = run_cli(kSmall + out + " --init-from " + mlp);
  CHECK(other.code == 2);
  CHECK_MESSAGE(other.output.find("it holds another kind of model (\"mlp inputs=64") !=
                    std::string::npos, other.output);
  CHECK_MESSAGE(other.output.find("not a GPT checkpoint (model.type gpt)") != std::string::npos,
                other.output);
  // A folder of runs: the runs in it are named.
  const auto parent = run_cli("train \"" + quickstart + "\"" + out + " --init-from " + runs);
  CHECK(parent.code == 2);
  CHECK_MESSAGE(parent.output.find(runs + ": no checkpoint (step_NNNNNNNN.safetensors and .state "
                                   "files); its subfolders hold some: name one of " + mlp) !=
                    std::string::npos, parent.output);
}
