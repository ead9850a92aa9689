// Exports read by PyTorch and Hugging Face transformers, and Hugging Face weights read back:
//   - an MLP export, loaded into torch.nn.Sequential as docs/cli.md says and fed raw samples with
//     the stored standardisation, predicts exactly what `lockstep eval` counts as correct;
//   - `lockstep export --format hf` loads in transformers.GPT2LMHeadModel with lockstep's
//     logits (1e-4 relative), as the dtype its config.json names (--dtype bf16: bfloat16), and `--init-from` a GPT-2 that transformers saved starts at the
//     loss transformers computes on the same windows (1e-5 relative);
//   - the tokenizer `export --format hf` writes beside the weights (from a rank file: vocab.json
//     and merges.txt) gives AutoTokenizer lockstep's ids.
// The first needs Debian's torch (/usr/bin/python3); the others the virtual environment that
// tests/interop/hf_venv.sh makes in the build tree (transformers from PyPI). Each skips, saying
// why, when its Python is not there.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "../skip.hpp"
#include "../text/vocab_files.hpp"
#include "python_env.hpp"
#include "lockstep/lockstep.hpp"
#include "lockstep/tokenizer.hpp"

namespace fs = std::filesystem;
using lockstep::test::run_cli;
using lockstep::test::run_command;

namespace {

const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kQuickstart = kSource + "/configs/quickstart.yaml";
const std::string kGptTiny = kSource + "/configs/gpt_tiny.yaml";

template <class T>
void write_raw(const fs::path& file, const std::vector<T>& v) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  REQUIRE(out.good());
}

// The number after `key` in `text`.
double number_after(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key);
  REQUIRE_MESSAGE(at != std::string::npos, key << " not in: " << text);
  return std::stod(text.substr(at + key.size()));
}

}  // namespace

TEST_CASE("interop: an MLP export in torch.nn.Sequential predicts what lockstep eval counts") {
  if (run_command("/usr/bin/python3 -c 'import torch, numpy'").code != 0)
    return lockstep::test::skip(lockstep::test::Skip::missing,
                                "/usr/bin/python3 cannot import torch and numpy (Debian: python3-torch)");
  const lockstep::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string(), out = (dir.path() / "m.safetensors").string();
  REQUIRE(run_cli("train \"" + kQuickstart + "\" --set trainer.steps=100 --set trainer.checkpoint.dir=" + ckpt).code == 0);
  REQUIRE(run_cli("export " + ckpt + " --out " + out).code == 0);

  // The eval split's raw samples, before any standardisation.
  const lockstep::Config cfg = lockstep::load_config(kQuickstart, std::vector<std::string>{"data.normalize=false"});
  const lockstep::DataSplit raw = lockstep::load_dataset(cfg);
  const lockstep::Dataset& eval = *raw.eval;
  std::vector<float> x(eval.size() * static_cast<std::size_t>(eval.features()));
  std::vector<std::int32_t> y(eval.size());
  for (std::size_t i = 0; i < eval.size(); ++i) eval.get(i, x.data() + i * eval.features(), &y[i]);
  write_raw(dir.path() / "x.f32", x);
  write_raw(dir.path() / "y.i32", y);

  const auto ours = run_cli("eval \"" + kQuickstart + "\" --checkpoint " + ckpt);
  REQUIRE_MESSAGE(ours.code == 0, ours.output);
  const long correct = std::lround(number_after(ours.output, "accuracy ") * static_cast<double>(eval.size()));
  const auto torch = run_command("/usr/bin/python3 \"" + kSource + "/tests/interop/mlp_export.py\" " + out +
                                 " " + (dir.path() / "x.f32").string() + " " + (dir.path() / "y.i32").string());
  REQUIRE_MESSAGE(torch.code == 0, torch.output);
  CHECK(torch.output == "correct " + std::to_string(correct) + " of " + std::to_string(eval.size()) + "\n");
}

TEST_CASE("interop: an export --dtype bf16 loads in safetensors+torch as torch's bf16 rounding") {
  const std::string python = lockstep::test::safetensors_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  const std::string f32 = (dir.path() / "f32.safetensors").string(), b16 = (dir.path() / "b16.safetensors").string();
  REQUIRE(run_cli("train \"" + kQuickstart + "\" --set trainer.steps=20 --set trainer.checkpoint.dir=" + ckpt).code == 0);
  REQUIRE(run_cli("export " + ckpt + " --out " + f32).code == 0);
  REQUIRE(run_cli("export " + ckpt + " --out " + b16 + " --dtype bf16").code == 0);
  const auto r = run_command(python + " \"" + kSource + "/tests/interop/bf16_export.py\" " + f32 + " " + b16);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.starts_with("equal "));
}

TEST_CASE("interop: export --format hf loads in transformers with lockstep's logits") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string(), hf = (dir.path() / "hf").string();
  // A vocabulary of 300 bytes and unused ids: lockstep pads its logits to 320 (Note [Padded
  // vocabulary]), transformers sees 300.
  const auto train = run_cli("train \"" + kGptTiny + "\" --set model.context=16 --set model.n_layer=2 "
                             "--set model.d_model=32 --set model.vocab_size=300 "
                             "--set trainer.steps=5 --set trainer.eval_every=0 "
                             "--set trainer.checkpoint.dir=" + ckpt);
  REQUIRE_MESSAGE(train.code == 0, train.output);
  // In shards of at most 20KB, as transformers reads them (model.safetensors.index.json).
  const auto exported = run_cli("export " + ckpt + " --format hf --max-shard-size 20KB --out " + hf);
  REQUIRE_MESSAGE(exported.code == 0, exported.output);
  REQUIRE(fs::exists(hf + "/model.safetensors.index.json"));

  // lockstep's logits for one window of 16 tokens, on the CPU.
  const lockstep::Checkpoint c = lockstep::CheckpointManager::load(ckpt);
  const lockstep::GptSpec spec = lockstep::parse_gpt_spec(c.metadata.at("lockstep.model"));
  const lockstep::Model model = lockstep::Model::gpt(spec);
  const std::unique_ptr<lockstep::Device> dev = lockstep::make_cpu_device(0, 1);
  lockstep::Replica replica(*dev, model, 1);
  replica.load_parameters(c.params);
  std::vector<std::int32_t> tokens;
  std::vector<float> as_floats;
  for (int t = 0; t < spec.context; ++t) {
    tokens.push_back((t * 41 + 7) % spec.vocab_size);
    as_floats.push_back(static_cast<float>(tokens.back()));
  }
  lockstep::DeviceArray<float> x(*dev, as_floats.size());
  x.upload(as_floats);
  // Each position's row of padded logits, its first vocab_size kept.
  std::vector<float> padded(static_cast<std::size_t>(model.outputs()));
  dev->copy_to_host(padded.data(), replica.forward(x.data(), 1), padded.size() * sizeof(float));
  const std::size_t width = padded.size() / static_cast<std::size_t>(spec.context);
  REQUIRE(width == 320);
  std::vector<float> logits;
  for (std::size_t t = 0; t < static_cast<std::size_t>(spec.context); ++t)
    logits.insert(logits.end(), padded.begin() + t * width,
                  padded.begin() + t * width + spec.vocab_size);
  write_raw(dir.path() / "tokens.i32", tokens);
  write_raw(dir.path() / "logits.f32", logits);

  const auto r = run_command(python + " \"" + kSource + "/tests/interop/hf_gpt2.py\" logits " + hf + " " +
                             (dir.path() / "tokens.i32").string() + " " + (dir.path() / "logits.f32").string());
  MESSAGE(r.output);
  CHECK_MESSAGE(r.code == 0, r.output);

  // --dtype: config.json's torch_dtype, which from_pretrained(torch_dtype="auto") loads as.
  const std::string hf16 = (dir.path() / "hf16").string();
  REQUIRE(run_cli("export " + ckpt + " --format hf --dtype bf16 --out " + hf16).code == 0);
  for (const auto& [folder, want] :
       {std::pair{hf, "torch.float32"}, std::pair{hf16, "torch.bfloat16"}}) {
    const auto d = run_command(python + " \"" + kSource + "/tests/interop/hf_gpt2.py\" dtype " + folder);
    CHECK_MESSAGE(d.output == std::string("config ") + want + ", loaded " + want + "\n", d.output);
  }
}

TEST_CASE("interop: --init-from a transformers GPT-2 starts at transformers' loss, also sharded in bf16") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  // 8 windows of 16 bytes: one global batch (1 worker x 8), the same windows transformers sees.
  std::string text;
  for (int i = 0; i < 8 * 16 + 1; ++i) text += static_cast<char>(32 + (i * 37 + i / 5) % 95);
  const std::string file = dir.write("t.txt", text).string(), hf = (dir.path() / "hf").string();
  const std::string sharded = (dir.path() / "hf_bf16").string();
  const auto made = run_command(python + " \"" + kSource + "/tests/interop/hf_gpt2.py\" random " + hf + " " +
                                file + " 16 " + sharded);
  REQUIRE_MESSAGE(made.code == 0, made.output);
  REQUIRE(fs::exists(sharded + "/model.safetensors.index.json"));

  // The bf16 shards widen exactly: the loss is transformers' with the same weights in fp32.
  for (const auto& [from, key] : {std::pair{hf, "loss "}, std::pair{sharded, "loss_bf16 "}}) {
    const double theirs = number_after(made.output, key);
    const std::string summary = (dir.path() / "s.json").string();
    const auto tune = run_cli("train \"" + kGptTiny + "\" --set model.context=16 --set model.n_layer=1 "
                              "--set model.n_head=2 --set model.d_model=32 --set trainer.devices=1 "
                              "--set data.batch_size=8 --set data.path=" + file + " --set data.eval_path=" + file +
                              " --set trainer.steps=1 --set trainer.log_every=1 --set trainer.eval_every=0 "
                              "--init-from " + from + " --summary-json " + summary +
                              " --set trainer.checkpoint.dir=" + from + "_tuned");
    REQUIRE_MESSAGE(tune.code == 0, tune.output);
    const double ours = lockstep::test::json_number(lockstep::test::read_text(summary), "final_train_loss");
    MESSAGE(from << ": first-step loss: lockstep " << ours << ", transformers " << theirs
                 << ", relative difference " << std::abs(ours - theirs) / theirs);
    CHECK(ours == doctest::Approx(theirs).epsilon(1e-5));
  }

  // The gpt keys the config sets must be config.json's.
  const auto other = run_cli("train \"" + kGptTiny + "\" --set model.context=16 --set model.n_layer=1 "
                             "--set model.n_head=4 --set model.d_model=32 --set trainer.steps=1 "
                             "--init-from " + hf);
  CHECK(other.code == 2);
  CHECK(other.output.find("model.n_head is 4 (--set model.n_head=4), 2 in the weights: --set "
                          "model.n_head=2") != std::string::npos);
}

TEST_CASE("interop: export --format hf writes the run's tokenizer, and AutoTokenizer gives lockstep's ids") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  const fs::path ranks = dir.write("small.tiktoken",
                                   lockstep::test::rank_file(lockstep::test::hand_vocab()));
  const std::string ckpt = (dir.path() / "ckpt").string(), hf = (dir.path() / "hf").string();
  REQUIRE(run_cli("train \"" + kGptTiny + "\" --set model.context=16 --set model.n_layer=1 "
                  "--set model.d_model=32 --set trainer.steps=1 --set trainer.eval_every=0 "
                  "--set data.tokenizer=" + ranks.string() + " --set trainer.checkpoint.dir=" + ckpt).code == 0);
  const auto exported = run_cli("export " + ckpt + " --format hf --out " + hf);
  REQUIRE_MESSAGE(exported.code == 0, exported.output);
  const std::string text = lockstep::test::read_text(kSource + "/third_party/shakespeare/as_you_like_it.txt")
                               .substr(0, 4000) + " abc d\xc3\xa9 eee  ab\n";
  const fs::path file = dir.write("t.txt", text);
  const auto r = run_command(python + " \"" + kSource + "/tests/interop/hf_gpt2.py\" tokenize " + hf + " " + file.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  std::string ours;
  for (const lockstep::TokenId id : lockstep::Tokenizer::load(ranks).encode(text)) {
    if (!ours.empty()) ours += ' ';
    ours += std::to_string(id);
  }
  CHECK(r.output.substr(r.output.rfind('\n', r.output.size() - 2) + 1) == ours + "\n");
}
