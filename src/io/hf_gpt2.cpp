// Reading and writing Hugging Face GPT-2 directories.
//
// Note [Hugging Face GPT-2]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// lockstep's GPT has GPT-2's architecture and nanoGPT's tensor names, which are Hugging Face's
// ("transformer.h.0.attn.c_attn.weight", ...), with two differences:
//   - HF's attention and MLP projections are Conv1D modules, whose weight is (in, out); ours
//     are (out, in), as torch.nn.Linear. c_attn, attn.c_proj, c_fc and mlp.c_proj are
//     transposed both ways. (attn.c_proj is square: a missing transpose would load silently.)
//   - The LM head is tied to wte: HF's save_pretrained leaves lm_head.weight out, and so do we.
// Files from the Hub (openai-community/gpt2) name tensors without "transformer." and carry
// each block's causal mask as "h.N.attn.bias" (and "attn.masked_bias"): the reader adds the
// prefix and skips those buffers. config.json gives the shapes (n_positions is our context)
// and must say activation_function "gelu_new", the tanh GELU we compute; the LayerNorm epsilon
// is 1e-5 on both sides.
#include "io/hf_gpt2.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <system_error>

#include "io/durable_file.hpp"
#include "io/json.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/hf_tokenizer_files.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kConfigName = "config.json", kWeightsName = "model.safetensors";
constexpr std::string_view kPrefix = "transformer.";

bool is_conv1d(std::string_view name) {
  return name.ends_with(".attn.c_attn.weight") || name.ends_with(".attn.c_proj.weight") ||
         name.ends_with(".mlp.c_fc.weight") || name.ends_with(".mlp.c_proj.weight");
}

// Appends `t` (rows x cols, row-major, at `src`) to `out`, transposed for a Conv1D weight.
void append_tensor(const ParamTensor& t, const float* src, SafetensorsFile& out) {
  ParamTensor copy = t;
  copy.offset = out.data.size();
  if (is_conv1d(t.name) && t.shape.size() == 2) {
    const std::size_t rows = static_cast<std::size_t>(t.shape[0]),
                      cols = static_cast<std::size_t>(t.shape[1]);
    std::swap(copy.shape[0], copy.shape[1]);
    for (std::size_t c = 0; c < cols; ++c)
      for (std::size_t r = 0; r < rows; ++r) out.data.push_back(src[r * cols + c]);
  } else {
    out.data.insert(out.data.end(), src, src + t.numel());
  }
  out.tensors.push_back(std::move(copy));
}

// An integer field of config.json.
int config_int(const detail::JsonValue& root, std::string_view key, const fs::path& file) {
  for (const auto& [name, value] : root.members)
    if (name == key) {
      double v = 0;
      if (value.kind == detail::JsonValue::Kind::number) v = std::strtod(value.text.c_str(), nullptr);
      if (value.kind != detail::JsonValue::Kind::number || v < 1 || v != std::floor(v) || v > 1e9)
        detail::fail_input(file, fmt::format("{}: expected a positive integer", key));
      return static_cast<int>(v);
    }
  detail::fail_input(file, fmt::format("{}: missing (a GPT-2 config.json has it)", key));
}

const detail::JsonValue* member(const detail::JsonValue& root, std::string_view key) {
  for (const auto& [name, value] : root.members)
    if (name == key) return &value;
  return nullptr;
}

GptSpec read_config_json(const fs::path& file) {
  detail::InputFile in(file);
  std::string text(in.size(), '\0');
  in.read(std::as_writable_bytes(std::span(text)), "config.json");
  detail::JsonValue root;
  try {
    root = detail::parse_json(text);
  } catch (const detail::JsonError& e) {
    detail::fail_input(file, fmt::format("offset {}: {}", e.offset(), e.what()));
  }
  if (root.kind != detail::JsonValue::Kind::object) detail::fail_input(file, "expected a JSON object");
  if (const auto* type = member(root, "model_type"); type && type->text != "gpt2")
    detail::fail_input(file, fmt::format("model_type: expected \"gpt2\", got \"{}\"", type->text));
  const auto* act = member(root, "activation_function");
  if (act && act->text != "gelu_new")
    detail::fail_input(file, fmt::format("activation_function: expected \"gelu_new\" (the tanh "
                                         "GELU lockstep computes), got \"{}\"", act->text));
  return {.vocab_size = config_int(root, "vocab_size", file),
          .context = config_int(root, "n_positions", file),
          .n_layer = config_int(root, "n_layer", file),
          .n_head = config_int(root, "n_head", file),
          .d_model = config_int(root, "n_embd", file)};
}

}  // namespace

namespace detail {

bool is_hf_gpt2(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return fs::exists(path / kConfigName, ec) && fs::exists(path / kWeightsName, ec);
  return path.filename() == kWeightsName && fs::exists(path.parent_path() / kConfigName, ec);
}

GptSpec read_hf_gpt2_spec(const fs::path& path, fs::path& file) {
  std::error_code ec;
  file = (fs::is_directory(path, ec) ? path : path.parent_path()) / kConfigName;
  return read_config_json(file);
}

SafetensorsFile read_hf_gpt2(const fs::path& path, fs::path& file) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? path : path.parent_path();
  file = dir / kWeightsName;
  const GptSpec spec = read_config_json(dir / kConfigName);
  const SafetensorsFile in = read_safetensors(file);
  SafetensorsFile out;
  out.metadata = in.metadata;
  out.metadata["lockstep.model"] = to_string(spec);
  for (const ParamTensor& t : in.tensors) {
    if (t.name.ends_with(".attn.bias") || t.name.ends_with(".attn.masked_bias") ||
        t.name == "lm_head.weight")
      continue;  // the causal mask buffers; the tied head
    ParamTensor named = t;
    if (!named.name.starts_with(kPrefix)) named.name = std::string(kPrefix) + named.name;
    append_tensor(named, in.data.data() + t.offset, out);
  }
  return out;
}

}  // namespace detail

void export_hf_gpt2(const Checkpoint& ckpt, const fs::path& dir, TensorDtype dtype,
                    const Tokenizer* tokenizer) {
  const auto model = ckpt.metadata.find("lockstep.model");
  if (model == ckpt.metadata.end() || !model->second.starts_with("gpt "))
    detail::fail_input(ckpt.weights_file,
                       fmt::format("not a GPT checkpoint ({}); the Hugging Face GPT-2 format (hf) "
                                   "needs model.type gpt",
                                   model == ckpt.metadata.end() ? "no lockstep.model in the metadata"
                                                                : "lockstep.model: " + model->second));
  GptSpec spec;
  try {
    spec = parse_gpt_spec(model->second);
  } catch (const std::invalid_argument& e) {
    detail::fail_input(ckpt.weights_file, e.what());
  }
  if (spec.llama_parts())
    detail::fail_input(ckpt.weights_file,
                       fmt::format("a Llama-family model ({}): the Hugging Face GPT-2 format "
                                   "holds GPT-2's parts only", model->second));
  if (tokenizer && tokenizer->vocab_size() > static_cast<std::size_t>(spec.vocab_size))
    detail::fail_input(ckpt.weights_file,
                       fmt::format("the tokenizer {} has {} ids, the model {}: not its tokenizer",
                                   tokenizer->source().string(), tokenizer->vocab_size(),
                                   spec.vocab_size));
  SafetensorsFile out;
  for (const ParamTensor& t : ckpt.tensors) append_tensor(t, ckpt.params.data() + t.offset, out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) detail::fail_input(dir, "cannot create the directory: " + ec.message());
  write_safetensors(dir / kWeightsName, out.tensors, out.data, {}, dtype);
  std::string special_ids;
  if (tokenizer) {
    detail::write_hf_tokenizer(*tokenizer, dir, spec.context);
    if (const auto eot = tokenizer->end_of_text())
      special_ids = fmt::format("  \"bos_token_id\": {},\n  \"eos_token_id\": {},\n", *eot, *eot);
  }
  const std::string config = fmt::format(
      "{{\n"
      "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
      "  \"model_type\": \"gpt2\",\n"
      "  \"vocab_size\": {},\n"
      "  \"n_positions\": {},\n"
      "  \"n_ctx\": {},\n"
      "  \"n_embd\": {},\n"
      "  \"n_layer\": {},\n"
      "  \"n_head\": {},\n"
      "  \"activation_function\": \"gelu_new\",\n"
      "  \"layer_norm_epsilon\": 1e-05,\n"
      "  \"tie_word_embeddings\": true,\n"
      "  \"resid_pdrop\": 0.0,\n"
      "  \"embd_pdrop\": 0.0,\n"
      "  \"attn_pdrop\": 0.0,\n"
      "{}"
      "  \"torch_dtype\": \"{}\"\n"
      "}}\n",
      spec.vocab_size, spec.context, spec.context, spec.d_model, spec.n_layer, spec.n_head,
      special_ids, dtype == TensorDtype::bf16 ? "bfloat16" : "float32");
  const std::span<const std::byte> bytes = std::as_bytes(std::span(config));
  detail::write_file_atomically(dir / kConfigName, std::span(&bytes, 1));
}

}  // namespace lockstep
