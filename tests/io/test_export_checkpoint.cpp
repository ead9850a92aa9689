// `lockstep export` as a library call (export_checkpoint in lockstep/checkpoint.hpp): what it
// writes and returns is what the CLI writes and prints, and bad options throw InputError named
// as the caller spells them.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "../cli/cli_runner.hpp"
#include "checkpoint_fixtures.hpp"
#include "lockstep/checkpoint.hpp"

namespace fs = std::filesystem;

namespace {

using lockstep::ExportRequest;
using lockstep::test::input_error_of;

constexpr lockstep::GptSpec kSpec{.vocab_size = 11, .context = 6, .n_layer = 1, .n_head = 2, .d_model = 16};

}  // namespace

TEST_CASE("export_checkpoint: torch and hf, as the CLI writes them, and what it reports") {
  const lockstep::test::TempDir dir;
  const fs::path ckpt = lockstep::test::save_gpt_checkpoint(dir.path() / "ckpt", kSpec, "ids");
  const lockstep::Checkpoint loaded = lockstep::CheckpointManager::load(ckpt);
  const fs::path torch = dir.path() / "torch.safetensors", cli_torch = dir.path() / "cli.safetensors";
  const lockstep::ExportResult r = lockstep::export_checkpoint({.checkpoint = ckpt, .out = torch});
  CHECK(r.tensors == loaded.tensors.size());
  CHECK(r.parameters == loaded.params.size());
  CHECK(r.step == 5);
  const lockstep::SafetensorsFile file = lockstep::read_safetensors(torch);
  CHECK(file.tensors.size() == loaded.tensors.size());
  CHECK(lockstep::test::same_bits(file.data, loaded.params));

  const auto cli = lockstep::test::run_cli("export '" + ckpt.string() + "' --out '" + cli_torch.string() + "'");
  REQUIRE_MESSAGE(cli.code == 0, cli.output);
  CHECK(cli.output == fmt::format("wrote {} ({} tensors, {} parameters, step {})\n",
                                  cli_torch.string(), r.tensors, r.parameters, r.step));
  CHECK(lockstep::test::slurp(cli_torch) == lockstep::test::slurp(torch));

  const fs::path hf = dir.path() / "hf";
  const lockstep::ExportResult h =
      lockstep::export_checkpoint({.checkpoint = ckpt, .out = hf, .format = "hf", .dtype = "bf16"});
  CHECK(h.tensors == r.tensors);
  CHECK(fs::is_regular_file(hf / "config.json"));
  CHECK(lockstep::weights_model(hf)->spec.d_model == kSpec.d_model);
}

TEST_CASE("export_checkpoint: bad options throw InputError naming them as the caller spells them") {
  const lockstep::test::TempDir dir;
  const fs::path ckpt = lockstep::test::save_gpt_checkpoint(dir.path() / "ckpt", kSpec, "ids");
  const ExportRequest good{.checkpoint = ckpt, .out = dir.path() / "out.safetensors"};
  const auto message = [&](auto change, lockstep::OptionSpelling spelling) {
    ExportRequest r = good;
    r.spelling = spelling;
    change(r);
    return input_error_of([&] { lockstep::export_checkpoint(r); });
  };
  using enum lockstep::OptionSpelling;
  const auto format = [](ExportRequest& r) { r.format = "onnx"; };
  const auto dtype = [](ExportRequest& r) { r.dtype = "fp16"; };
  const auto no_out = [](ExportRequest& r) { r.out.clear(); };
  CHECK(message(format, field) == "format: expected torch, hf or peft, got 'onnx'");
  CHECK(message(format, flag) == "--format: expected torch, hf or peft, got 'onnx'");
  CHECK(message(dtype, field) == "dtype: expected fp32 or bf16, got 'fp16'");
  CHECK(message(dtype, flag) == "--dtype: expected fp32 or bf16, got 'fp16'");
  CHECK(message(no_out, field) == "export: expected out FILE");
  const auto no_out_hf = [](ExportRequest& r) {
    r.out.clear();
    r.format = "hf";
  };
  CHECK(message(no_out_hf, flag) == "export: expected --out DIR");
  CHECK(message([](ExportRequest& r) { r.checkpoint.clear(); }, field) == "export: expected checkpoint CKPT");
  // Over the checkpoint's own weights: refused before anything is written.
  const fs::path weights = ckpt / "step_00000005.safetensors";
  const std::string own = message([&](ExportRequest& r) { r.out = weights; }, field);
  CHECK(own.starts_with("export out " + weights.string() + ": is the same file as the checkpoint's weights "));
  const fs::path missing = dir.path() / "missing" / "m.safetensors";
  CHECK(message([&](ExportRequest& r) { r.out = missing; }, flag).starts_with("export --out " + missing.string() + ": "));
  CHECK_FALSE(fs::exists(good.out));
}
