// load_weights(): the weights of a checkpoint, an export or a Hugging Face directory in
// the layout of the model being trained, for `lockstep train --init-from`.
//
// Tensors are matched by name, not by offset, so a file written in another buffer order (an
// export from another tool, Hugging Face's) loads as long as every tensor is there with its
// shape; each is read from the file straight into its place, F32, BF16 or F16 (load_hf_tensors
// in hf_weights.hpp). Nothing but the weights is read: the run starts at step 0 with a fresh
// optimiser.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "io/durable_file.hpp"
#include "io/hf_model.hpp"
#include "io/hf_weights.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

// The kind of model (the first word of "lockstep.model": "gpt", "mlp") whose tensors these are:
// a GPT's are named transformer.*.
std::string_view model_kind(std::span<const ParamTensor> tensors) {
  return std::any_of(tensors.begin(), tensors.end(),
                     [](const ParamTensor& t) { return t.name.starts_with("transformer."); })
             ? "gpt"
             : "mlp";
}

// The weights file at `path`: a checkpoint directory's newest valid checkpoint's (the whole
// checkpoint verified), either file of a checkpoint, or any safetensors file.
fs::path weights_file_of(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec) || path.extension() == ".state")
    return CheckpointManager::load(path).weights_file;
  if (!fs::exists(path, ec)) detail::fail_input(path, "no such file or directory");
  return path;
}

// lockstep's own files name tensors as the model does; an MLP export's standardisation
// (normalize.mean, normalize.std) is not weights.
const detail::HfTensorNames kLockstepNames{
    .to_lockstep = [](std::string_view name) {
      return name.starts_with("normalize.") ? std::string() : std::string(name);
    },
    .transposed = [](std::string_view) { return false; }};

}  // namespace

Weights load_weights(const fs::path& path, std::span<const ParamTensor> expected) {
  if (detail::is_hf_dir(path)) return detail::load_hf_weights(path, expected);
  Weights out;
  out.file = weights_file_of(path);
  detail::HfWeights in(out.file);
  // Another kind of model than the config's (an MLP's checkpoint for a GPT) is said as such, not
  // as its first missing tensor; sample says the same.
  const auto recorded = in.metadata().find("lockstep.model");
  const std::string_view want = model_kind(expected);
  if (recorded != in.metadata().end() &&
      recorded->second.substr(0, recorded->second.find(' ')) != want)
    detail::fail_input(out.file, fmt::format("it holds another kind of model (\"{}\"): not {} "
                                             "checkpoint (model.type {}) (--init-from needs the "
                                             "config's model)", recorded->second,
                                             want == "gpt" ? "a GPT" : "an MLP", want));
  std::size_t count = 0;
  for (const ParamTensor& e : expected) count = std::max(count, e.offset + e.numel());
  out.params.assign(count, 0.0f);
  detail::load_hf_tensors(in, kLockstepNames, expected, out.params);
  out.metadata = in.metadata();
  return out;
}

std::optional<WeightsModel> weights_model(const fs::path& path) {
  WeightsModel out;
  if (detail::is_hf_dir(path)) {
    const detail::HfConfig hf = detail::read_hf_dir_config(path, out.file);
    out.spec = detail::gpt_spec_of(hf);
    out.keys = hf.model_keys();
    if (!hf.is_gpt2()) {  // rotary positions: max_position_embeddings is a limit
      out.max_context = hf.context;
      out.max_context_field = "max_position_embeddings";
      if (hf.sliding_window && *hf.sliding_window < out.max_context) {
        out.max_context = *hf.sliding_window;
        out.max_context_field = "sliding_window (lockstep does not model sliding-window attention)";
      }
    }
    return out;
  }
  out.file = weights_file_of(path);
  const std::map<std::string, std::string> metadata = detail::SafetensorsReader(out.file).metadata();
  const auto model = metadata.find("lockstep.model");
  if (model == metadata.end() || !model->second.starts_with("gpt ")) return std::nullopt;
  try {
    out.spec = parse_gpt_spec(model->second);
  } catch (const std::invalid_argument& e) {
    detail::fail_input(out.file, e.what());
  }
  out.keys = {{"vocab_size", std::to_string(out.spec.vocab_size)},
              {"context", std::to_string(out.spec.context)},
              {"n_layer", std::to_string(out.spec.n_layer)},
              {"n_head", std::to_string(out.spec.n_head)},
              {"d_model", std::to_string(out.spec.d_model)}};
  return out;
}

}  // namespace lockstep
