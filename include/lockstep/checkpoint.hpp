// Checkpoints: the weights as safetensors, the training state beside them, crash-safe saves.
//
//   lockstep::CheckpointManager ckpts("runs/a/checkpoints", /*keep_last=*/3);
//   ckpts.save({.tensors = model.param_tensors(), .params = replica.parameters(),
//               .state = {.step = 500, .epoch = 2, .batch_in_epoch = 17, ...},
//               .optimizer_state = {{"momentum", momentum}}});
//   std::optional<lockstep::Checkpoint> last =
//       ckpts.load_latest([](const std::string& w) { std::fprintf(stderr, "%s\n", w.c_str()); });
//
// A checkpoint of step S is two files in one directory:
//   step_<S, 8 digits>.safetensors  the parameters (https://github.com/huggingface/safetensors),
//                                   one F32 tensor per ParamTensor, loadable by
//                                   safetensors.numpy.load_file or torch;
//   step_<S, 8 digits>.state        the TrainState and the optimiser's state vectors (see
//                                   src/io/state_file.hpp for the format).
// Each file is written to "<name>.tmp", fsynced and renamed into place, so a crash leaves
// either the old file or the new one; the .state file is written last. A checkpoint is complete
// when both files exist and verify (checksums, and the .state names the weights' checksum, so
// files of two different saves never pair up). Leftover .tmp files are ignored by readers; a
// training run removes those of dead writers when it takes the directory.
//
// Checksums are FNV-1a 64 of the bytes, as 16 lowercase hex digits in the safetensors metadata
// ("lockstep.checksum", over the data section, which the .state names; "lockstep.file_checksum",
// over the whole file: Note [Whole-file checksum] in src/io/safetensors.cpp) and as a u64 in
// the .state file (over the whole file but the checksum itself; version 1 files, over the
// payload only, are still read).
//
// Readers take untrusted bytes: a truncated or corrupt file throws InputError naming the file,
// the byte offset or tensor, and what was expected. Write failures throw std::system_error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/export.hpp"
#include "lockstep/model.hpp"
#include "lockstep/types.hpp"

namespace lockstep {
class Tokenizer;  // lockstep/tokenizer.hpp, for export_hf
}

namespace lockstep {

// ---- safetensors ----------------------------------------------------------------------------

struct LOCKSTEP_API SafetensorsFile {
  std::vector<ParamTensor> tensors;  // sorted by offset; offsets index `data`, in elements
  std::vector<float> data;           // the data section, so tensors keep their file layout
  std::map<std::string, std::string> metadata;
};

// How write_safetensors stores the values: F32 as they are, or BF16, each rounded to the
// nearest bf16, ties to even (`lockstep export --dtype bf16`; checkpoints are always F32).
enum class TensorDtype { f32, bf16 };

// Writes `params` as one F32 (or BF16) tensor per entry of `tensors`, each read from its offset; the
// tensors must tile `params` exactly (std::invalid_argument otherwise). The data section is
// `params` byte for byte (F32), so reading it back restores the buffer layout. The metadata gets
// "format": "pt", "lockstep.version", "lockstep.checksum" and "lockstep.file_checksum",
// replacing any given values.
// Returns the checksum. Crash-safe as described above.
LOCKSTEP_API std::uint64_t write_safetensors(const std::filesystem::path& file,
                                             std::span<const ParamTensor> tensors,
                                             std::span<const float> params,
                                             const std::map<std::string, std::string>& metadata = {},
                                             TensorDtype dtype = TensorDtype::f32);

// Reads any safetensors file of F32 tensors whole (checkpoints; load_weights reads BF16 and F16
// too, a tensor at a time). Checks the whole file against
// "lockstep.file_checksum" and the data against "lockstep.checksum" when the metadata has them. Headers are limited to 100 MB, as in the reference implementation.
LOCKSTEP_API SafetensorsFile read_safetensors(const std::filesystem::path& file);

// ---- training state -------------------------------------------------------------------------

// Where training stands after `step` optimiser steps: what a resumed run needs besides weights.
struct LOCKSTEP_API TrainState {
  std::int64_t step = 0;             // optimiser steps done; also the lr schedule's position
  std::uint64_t epoch = 0;           // the sampler epoch of the next batch
  std::uint64_t batch_in_epoch = 0;  // batches of `epoch` each worker has consumed since
                                     // epoch_start
  // The position in `epoch`'s sample order where its current sharding over `workers` began: 0,
  // but after a change of worker count mid-epoch (Note [Re-sharding] in
  // src/train/worker_loop.cpp). Samples served in the epoch: its positions [0, epoch_start +
  // batch_in_epoch x batch x workers).
  std::uint64_t epoch_start = 0;
  std::int64_t samples = 0;          // training samples consumed, over all workers
  std::uint64_t config_hash = 0;     // config_hash() of the run that wrote it
  std::int32_t workers = 0;          // the device count that wrote it; must be >= 1
  OptimizerKind optimizer = OptimizerKind::sgd;
  std::int64_t optimizer_steps = 0;  // Optimizer::steps_taken(): AdamW's bias-correction t
  std::uint64_t seed = 0;            // trainer.seed
  // config_values() of the run that wrote it, so that a refused resume names what changed;
  // empty when read from a state file older than version 3, which recorded the hash alone.
  std::vector<std::pair<std::string, std::string>> config;
};

// One optimiser buffer in the parameter buffer's layout: "momentum" (SGD with momentum),
// "adamw.m" and "adamw.v".
struct LOCKSTEP_API StateVector {
  std::string name;
  std::vector<float> values;
};

struct LOCKSTEP_API Checkpoint {
  std::vector<ParamTensor> tensors;  // names, shapes and offsets into `params`
  std::vector<float> params;         // the model's parameter buffer
  TrainState state;
  std::vector<StateVector> optimizer_state;  // each params.size() long
  // Extra safetensors metadata, e.g. "lockstep.model" (the architecture, for `lockstep sample`)
  // and "lockstep.tokenizer". Loads return the file's whole metadata.
  std::map<std::string, std::string> metadata;
  std::filesystem::path weights_file;        // set by loads, for messages
};

// Throws InputError naming ckpt.weights_file unless `ckpt` has exactly the tensors `expected`
// (names, shapes and offsets; Model::param_tensors()).
LOCKSTEP_API void check_layout(const Checkpoint& ckpt, std::span<const ParamTensor> expected);

// A LoRA checkpoint (one recording "lockstep.lora") made, in place, the checkpoint of its merged
// model: the base read again from where its run read it and checked by content hash, then
// W + (alpha / r) B A in the layout of the model without adapters, the LoRA records gone (Note
// [LoRA exports] in src/io/lora_checkpoint.cpp); true. Any other checkpoint: unchanged, false.
// InputError naming the checkpoint when its base is gone or differs, ending with `way_out`.
LOCKSTEP_API bool merge_lora_checkpoint(Checkpoint& ckpt, const std::string& way_out = {});

// ---- starting from weights (`lockstep train --init-from`) -----------------------------------

struct LOCKSTEP_API Weights {
  std::vector<float> params;                    // in the layout the caller asked for
  std::map<std::string, std::string> metadata;  // the file's, e.g. "lockstep.model"
  std::filesystem::path file;                   // the weights file read, for messages
};

// The weights at `path` in the layout of `expected` (Model::param_tensors()), matched by tensor
// name: a checkpoint directory (its newest valid checkpoint), either file of a checkpoint, a
// safetensors file (`lockstep export`, F32 or BF16), or a Hugging Face directory (config.json and
// model.safetensors or model.safetensors.index.json and its shards, F32, BF16 or F16, as
// save_pretrained and `lockstep export --format hf` write them) or its weights file. Throws
// InputError naming the file and the first tensor that is missing, of another shape, or not in
// the model.
LOCKSTEP_API Weights load_weights(const std::filesystem::path& path,
                                  std::span<const ParamTensor> expected);

// The GPT architecture the weights at `path` (as load_weights takes it) record, and the file
// that records it: a Hugging Face directory's config.json, else the weights file's
// "lockstep.model". nullopt when they record none, or an MLP. InputError as load_weights.
struct LOCKSTEP_API WeightsModel {
  GptSpec spec;
  std::filesystem::path file;
  // The model.* keys (without "model.") the weights record, values as YAML text: spec's, or all
  // that a Hugging Face config.json says (its family, norm, rope_theta, ...).
  std::vector<std::pair<std::string, std::string>> keys;
  // 0: a run's model.context must be keys' context (learned positions). Else the longest context
  // a run may train at (rotary positions: a shorter one is the run's choice), and the field of
  // config.json that sets it.
  int max_context = 0;
  std::string max_context_field;
};
LOCKSTEP_API std::optional<WeightsModel> weights_model(const std::filesystem::path& path);

// ---- what a model's inputs need --------------------------------------------------------------

// The standardisation an MLP's inputs need (x = (raw - mean) / std, per feature): the train
// split's statistics under data.normalize. Checkpoints record it in their metadata as
// "lockstep.normalize.mean" and "lockstep.normalize.std" (JSON arrays), exports also as the
// tensors "normalize.mean" and "normalize.std".
struct LOCKSTEP_API Standardization {
  std::vector<float> mean;
  std::vector<float> std;
};
LOCKSTEP_API void record_standardization(std::map<std::string, std::string>& metadata,
                                         std::span<const float> mean, std::span<const float> std);
// nullopt when the metadata records none; InputError naming the key when it is malformed.
LOCKSTEP_API std::optional<Standardization> read_standardization(
    const std::map<std::string, std::string>& metadata);

// ---- exports ----------------------------------------------------------------------------------

// `lockstep export --format torch`: the checkpoint's tensors under their own names, its
// metadata, and for a standardised MLP the tensors "normalize.mean" and "normalize.std" after
// the weights. Crash-safe; InputError when the file's directory does not exist.
LOCKSTEP_API void export_torch(const Checkpoint& ckpt, const std::filesystem::path& file,
                               TensorDtype dtype = TensorDtype::f32);

// Writes a GPT checkpoint (model.type gpt) as a Hugging Face directory that transformers'
// from_pretrained(dir) loads (GPT2LMHeadModel: HF's names, Conv1D weights transposed to
// (in, out)): config.json, generation_config.json and the weights, model.safetensors or, above
// `max_shard_bytes`, shards and model.safetensors.index.json (Note [Hugging Face exports] in
// src/io/hf_model.cpp). Creates `dir`. InputError for a checkpoint without "lockstep.model" (not
// a GPT's). With a `tokenizer` (the run's: see recorded_tokenizer in lockstep/tokenizer.hpp), its
// files too, for AutoTokenizer, and <|endoftext|> as bos_token_id and eos_token_id.
LOCKSTEP_API void export_hf(const Checkpoint& ckpt, const std::filesystem::path& dir,
                            TensorDtype dtype = TensorDtype::f32,
                            const Tokenizer* tokenizer = nullptr,
                            std::uint64_t max_shard_bytes = 5'000'000'000);

// ---- the checkpoint directory ---------------------------------------------------------------

struct LOCKSTEP_API CheckpointFiles {
  std::int64_t step = 0;
  std::filesystem::path weights;  // .safetensors
  std::filesystem::path state;    // .state
};

class LOCKSTEP_API CheckpointManager {
 public:
  using Warn = std::function<void(const std::string&)>;

  // keep_last: how many complete checkpoints save() keeps; 0 keeps all.
  CheckpointManager(std::filesystem::path dir, int keep_last);

  const std::filesystem::path& dir() const noexcept { return dir_; }

  // Writes ckpt as step ckpt.state.step, creating the directory if needed. Once it is
  // complete, removes every file of older steps except the newest keep_last - 1 complete
  // checkpoints: so incomplete and corrupt older ones go too. Newer steps are never touched.
  // Nothing is removed if writing fails. Throws std::invalid_argument for a Checkpoint that
  // does not hold together (state vectors of the wrong length, workers < 1, negative step).
  // Saving a step that already has a checkpoint replaces it, and that pair is incomplete
  // until the save ends: save each step once. `stage_done`, if set, is called after each
  // stage (weights written, state written, verified, older ones removed), so that a caller's
  // watchdog sees a slow save progress.
  CheckpointFiles save(const Checkpoint& ckpt, const std::function<void()>& stage_done = {});

  // The steps with at least one checkpoint file (complete or not), ascending; none when the
  // directory is missing. Reads no file.
  std::vector<std::int64_t> steps_with_files() const;

  // Removes every checkpoint file in the directory (a run that starts over: Note [A used
  // checkpoint directory] in src/train/run_files.hpp). Throws InputError naming a file that
  // cannot be removed.
  void remove_all() const;

  // Complete checkpoints, oldest first. Reads every file in full to verify it.
  std::vector<CheckpointFiles> list() const;

  // The newest valid checkpoint; each newer one that is missing a file or corrupt is skipped
  // with warn("<file>: <reason>; using the previous checkpoint step_..."). nullopt when the
  // directory holds no checkpoint files; InputError when it holds some but none is valid.
  std::optional<Checkpoint> load_latest(const Warn& warn = {}) const;

  // The newest weights file that verifies on its own (its checksums), complete checkpoint or
  // not: what `--init-from` can still start from when a save was interrupted after its weights.
  // nullopt when there is none.
  std::optional<std::filesystem::path> whole_weights() const;

  // A directory (its newest valid checkpoint), or either file of one checkpoint.
  static Checkpoint load(const std::filesystem::path& path, const Warn& warn = {});

 private:
  std::filesystem::path dir_;
  int keep_last_;
};

// ---- `lockstep export` as one call ------------------------------------------------------------

// How an InputError about a request (ExportRequest, SampleRequest in lockstep/generate.hpp)
// names the option at fault: as the request's field, which is also the Python keyword argument
// (`top_k`), or as the CLI's flag (`--top-k`): Note [Requests] in src/common/option_name.hpp.
enum class OptionSpelling { field, flag };

// `lockstep export`, as a library call:
//
//   lockstep::ExportResult r = lockstep::export_checkpoint(
//       {.checkpoint = "runs/a/checkpoints", .out = "hf_model", .format = "hf", .dtype = "bf16"});
// Every field has a default ({} at least), so that a designated initializer may leave any out.
struct LOCKSTEP_API ExportRequest {
  std::filesystem::path checkpoint{};  // a checkpoint directory (its newest) or either file of one
  std::filesystem::path out{};         // the file (torch) or the directory (hf) to write
  // "torch": export_torch; "hf": export_hf (a LoRA checkpoint's adapters merged into its base:
  // W + (alpha / rank) B A in fp32); "peft": a LoRA checkpoint's adapters as a PEFT adapter
  // directory (Note [PEFT adapters] in src/io/peft.cpp).
  std::string format = "torch";
  // hf, a LoRA checkpoint: the frozen base alone, without the adapters.
  bool base = false;
  std::string dtype = "fp32";        // "fp32" or "bf16"
  // hf only: the largest shard, as transformers' max_shard_size ("5GB", "500MB", "2GiB", bytes);
  // larger weights are written in shards with model.safetensors.index.json.
  std::string max_shard_size = "5GB";
  // hf only: the run's tokenizer when it has moved (DIR|FILE); empty: the one the checkpoint
  // records (recorded_tokenizer in lockstep/tokenizer.hpp), or none.
  std::filesystem::path tokenizer{};
  OptionSpelling spelling = OptionSpelling::field;
  CheckpointManager::Warn warn{};  // what loading the checkpoint warns about (a skipped newer one)
};

// What an export wrote: the checkpoint's tensor and parameter counts and its step.
struct LOCKSTEP_API ExportResult {
  std::size_t tensors = 0;
  std::size_t parameters = 0;
  std::int64_t step = 0;
};

// Checks the request (InputError naming the option: a format or dtype not listed above, no
// `out`, an `out` that cannot be written (Note [Checking an output]) or that is the
// checkpoint's own weights or state), loads the checkpoint, and writes it in `format`.
LOCKSTEP_API ExportResult export_checkpoint(const ExportRequest& request);

}  // namespace lockstep
