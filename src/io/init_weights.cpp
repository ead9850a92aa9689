// load_weights(): the weights of a checkpoint, an export or a Hugging Face directory in
// the layout of the model being trained, for `lockstep train --init-from`.
//
// Tensors are matched by name, not by offset, so a file written in another buffer order (an
// export from another tool, Hugging Face's) loads as long as every tensor is there with its
// shape. Nothing but the weights is read: the run starts at step 0 with a fresh optimiser.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "io/durable_file.hpp"
#include "io/hf_model.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

std::string shape_text(const ParamTensor& t) { return fmt::format("[{}]", fmt::join(t.shape, ", ")); }

// The kind of model (the first word of "lockstep.model": "gpt", "mlp") whose tensors these are:
// a GPT's are named transformer.*.
std::string_view model_kind(std::span<const ParamTensor> tensors) {
  return std::any_of(tensors.begin(), tensors.end(),
                     [](const ParamTensor& t) { return t.name.starts_with("transformer."); })
             ? "gpt"
             : "mlp";
}

// The file at `path` as safetensors: a checkpoint directory's newest valid checkpoint, either
// file of a checkpoint, or any safetensors file (a Hugging Face directory is read by
// load_hf_weights).
SafetensorsFile read_weights_file(const fs::path& path, fs::path& file) {
  std::error_code ec;
  if (fs::is_directory(path, ec) || path.extension() == ".state") {
    const Checkpoint ckpt = CheckpointManager::load(path);
    file = ckpt.weights_file;
    return {.tensors = ckpt.tensors, .data = ckpt.params, .metadata = ckpt.metadata};
  }
  if (!fs::exists(path, ec)) detail::fail_input(path, "no such file or directory");
  file = path;
  return read_safetensors(path);
}

}  // namespace

Weights load_weights(const fs::path& path, std::span<const ParamTensor> expected) {
  if (detail::is_hf_dir(path)) return detail::load_hf_weights(path, expected);
  Weights out;
  const SafetensorsFile in = read_weights_file(path, out.file);
  const auto fail = [&](const std::string& what) {
    detail::fail_input(out.file, what + " (--init-from needs the config's model)");
  };
  // Another kind of model than the config's (an MLP's checkpoint for a GPT) is said as such, not
  // as its first missing tensor; sample says the same.
  const auto recorded = in.metadata.find("lockstep.model");
  const std::string_view want = model_kind(expected);
  if (recorded != in.metadata.end() &&
      recorded->second.substr(0, recorded->second.find(' ')) != want)
    fail(fmt::format("it holds another kind of model (\"{}\"): not {} checkpoint (model.type "
                     "{})", recorded->second, want == "gpt" ? "a GPT" : "an MLP", want));
  std::size_t count = 0;
  for (const ParamTensor& e : expected) count = std::max(count, e.offset + e.numel());
  out.params.assign(count, 0.0f);
  for (const ParamTensor& e : expected) {
    const auto it = std::find_if(in.tensors.begin(), in.tensors.end(),
                                 [&](const ParamTensor& t) { return t.name == e.name; });
    if (it == in.tensors.end())
      fail(fmt::format("tensor '{}': missing; the config's model has shape {}", e.name,
                       shape_text(e)));
    if (it->shape != e.shape)
      fail(fmt::format("tensor '{}': shape {} in the file, {} in the config's model", e.name,
                       shape_text(*it), shape_text(e)));
    std::copy_n(in.data.begin() + static_cast<std::ptrdiff_t>(it->offset), e.numel(),
                out.params.begin() + static_cast<std::ptrdiff_t>(e.offset));
  }
  for (const ParamTensor& t : in.tensors)
    if (!t.name.starts_with("normalize.") &&  // an MLP export's standardisation: not weights
        std::none_of(expected.begin(), expected.end(),
                     [&](const ParamTensor& e) { return e.name == t.name; }))
      fail(fmt::format("tensor '{}' (shape {}): not in the config's model", t.name, shape_text(t)));
  out.metadata = in.metadata;
  return out;
}

std::optional<WeightsModel> weights_model(const fs::path& path) {
  WeightsModel out;
  if (detail::is_hf_dir(path)) {
    const detail::HfConfig hf = detail::read_hf_dir_config(path, out.file);
    out.spec = {.vocab_size = hf.vocab_size, .context = hf.context, .n_layer = hf.n_layer,
                .n_head = hf.n_head, .d_model = hf.d_model};
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
  const SafetensorsFile in = read_weights_file(path, out.file);
  const auto model = in.metadata.find("lockstep.model");
  if (model == in.metadata.end() || !model->second.starts_with("gpt ")) return std::nullopt;
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
