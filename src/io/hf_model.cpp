// Reading and writing Hugging Face model directories.
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
//
// The Llama family's tensors need no such table: the decoder's parameters carry Hugging Face's
// names ("model.layers.0.self_attn.q_proj.weight", ...) and nn.Linear's (out, in) layout, so they
// load by name. Checkpoints written by transformers before 4.31 carry each layer's RoPE
// frequencies as "rotary_emb.inv_freq", a buffer computed from rope_theta: skipped. Everything
// else a file holds must be a parameter of the model (lm_head.weight of a tied config is not).
//
// Note [Hugging Face token ids]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// config.json's bos_token_id and eos_token_id (an int or a list: Llama 3.1 stops at three) go
// with the weights --init-from reads as the metadata "lockstep.bos_token_ids" and
// "lockstep.eos_token_ids" (JSON arrays); the Trainer keeps them in its checkpoints, what
// sampling stops at, and `export --format hf` writes them back (else the tokenizer's
// <|endoftext|>).
//
// Note [Hugging Face exports]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `export --format hf` writes config.json (hf_config_json), generation_config.json, the tokenizer
// the run recorded (its own files copied) and the weights, F32 or BF16: model.safetensors, or
// above --max-shard-size the shards model-0000K-of-0000N.safetensors and
// model.safetensors.index.json. Shards are cut as transformers' save_pretrained cuts them: the
// tensors in order, a new shard when the next tensor would take the current one past the size
// (a tensor larger than the size has a shard of its own). The other form's files left in the
// directory by an earlier export (model.safetensors, the index, shards of another count) are
// removed, since from_pretrained would read them first.
#include "io/hf_model.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <system_error>

#include "io/durable_file.hpp"
#include "io/hf_weights.hpp"
#include "io/json.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/hf_tokenizer_files.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kConfigName = "config.json",
                           kGenerationConfigName = "generation_config.json";
constexpr std::string_view kGpt2Prefix = "transformer.";

bool is_conv1d(std::string_view name) {
  return name.ends_with(".attn.c_attn.weight") || name.ends_with(".attn.c_proj.weight") ||
         name.ends_with(".mlp.c_fc.weight") || name.ends_with(".mlp.c_proj.weight");
}

// Note [Hugging Face GPT-2]; the Llama family's names are lockstep's.
detail::HfTensorNames tensor_names(const detail::HfConfig& config) {
  if (config.is_gpt2())
    return {.to_lockstep = [](std::string_view name) -> std::string {
              if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
                  name == "lm_head.weight")
                return {};  // the causal mask buffers; the tied head
              return name.starts_with(kGpt2Prefix) ? std::string(name)
                                                   : std::string(kGpt2Prefix) + std::string(name);
            },
            .transposed = is_conv1d};
  return {.to_lockstep = [](std::string_view name) -> std::string {
            return name.ends_with(".rotary_emb.inv_freq") ? std::string() : std::string(name);
          },
          .transposed = [](std::string_view) { return false; }};
}

fs::path dir_of(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? path : path.parent_path();
}

// The architecture a checkpoint's "lockstep.model" describes, as config.json says it: GPT-2, or
// a Llama-family decoder as LlamaForCausalLM, Qwen2ForCausalLM when it has q/k/v biases
// (Mistral's layers are Llama's).
detail::HfConfig hf_config_of(const GptSpec& spec) {
  detail::HfConfig out;
  const bool qwen2 = spec.llama_parts() && spec.qkv_bias;
  out.family = !spec.llama_parts() ? "gpt2" : qwen2 ? "qwen2" : "llama";
  out.architecture = !spec.llama_parts() ? "GPT2LMHeadModel" : qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  out.vocab_size = spec.vocab_size;
  out.context = spec.context;
  out.n_layer = spec.n_layer;
  out.n_head = spec.n_head;
  out.n_kv_head = spec.kv_heads();
  out.d_model = spec.d_model;
  out.head_dim = spec.head_size();
  out.intermediate_size = spec.hidden_size();
  out.norm_eps = spec.norm_eps;
  out.rope_theta = spec.rope_theta;
  out.rope_scaling = spec.rope_scaling;
  out.qkv_bias = spec.qkv_bias;
  out.proj_bias = spec.proj_bias;
  out.tie_embeddings = spec.tie_embeddings;
  return out;
}

// The tensors to write, in the checkpoint's order, and their values: GPT-2's Conv1D weights
// transposed to (in, out) in a copy, the Llama family's the checkpoint's own.
struct ExportTensors {
  std::vector<ParamTensor> tensors;
  std::vector<float> transposed;  // GPT-2's, all its tensors
  std::span<const float> values;
};

ExportTensors export_tensors(const Checkpoint& ckpt, const detail::HfConfig& config) {
  ExportTensors out;
  if (!config.is_gpt2()) {
    out.tensors = ckpt.tensors;
    out.values = ckpt.params;
    return out;
  }
  for (const ParamTensor& t : ckpt.tensors) {
    const float* src = ckpt.params.data() + t.offset;
    ParamTensor copy = t;
    copy.offset = out.transposed.size();
    if (is_conv1d(t.name) && t.shape.size() == 2) {
      const auto rows = static_cast<std::size_t>(t.shape[0]), cols = static_cast<std::size_t>(t.shape[1]);
      std::swap(copy.shape[0], copy.shape[1]);
      for (std::size_t c = 0; c < cols; ++c)
        for (std::size_t r = 0; r < rows; ++r) out.transposed.push_back(src[r * cols + c]);
    } else {
      out.transposed.insert(out.transposed.end(), src, src + t.numel());
    }
    out.tensors.push_back(std::move(copy));
  }
  out.values = out.transposed;
  return out;
}

// Note [Hugging Face exports]: [begin, end) of the tensors (sorted by offset) in each shard.
std::vector<std::pair<std::size_t, std::size_t>> shard_ranges(std::span<const ParamTensor> tensors,
                                                              std::size_t element_bytes,
                                                              std::uint64_t max_bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t size = tensors[i].numel() * element_bytes;
    if (out.empty() || (bytes + size > max_bytes && out.back().second > out.back().first)) {
      out.emplace_back(i, i);
      bytes = 0;
    }
    out.back().second = i + 1;
    bytes += size;
  }
  return out;
}

void write_text(const fs::path& file, const std::string& text) {
  const std::span<const std::byte> bytes = std::as_bytes(std::span(text));
  detail::write_file_atomically(file, std::span(&bytes, 1));
}

// Writes the weights whole or in shards, and removes the other form's files.
void write_hf_weights(const fs::path& dir, const ExportTensors& out, TensorDtype dtype,
                      std::uint64_t max_shard_bytes) {
  std::vector<ParamTensor> sorted = out.tensors;
  std::sort(sorted.begin(), sorted.end(),
            [](const ParamTensor& a, const ParamTensor& b) { return a.offset < b.offset; });
  const std::size_t element_bytes = dtype == TensorDtype::bf16 ? 2 : sizeof(float);
  const auto ranges = shard_ranges(sorted, element_bytes, max_shard_bytes);
  std::vector<fs::path> written;
  std::map<std::string, std::string> weight_map;  // sorted by name, as transformers writes it
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < ranges.size(); ++s) {
    const std::string name = ranges.size() == 1
                                 ? std::string(detail::kHfWeightsName)
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, ranges.size());
    const auto [first, last] = ranges[s];
    const std::size_t begin = sorted[first].offset;
    std::vector<ParamTensor> shard(sorted.begin() + static_cast<std::ptrdiff_t>(first),
                                   sorted.begin() + static_cast<std::ptrdiff_t>(last));
    for (ParamTensor& t : shard) {
      t.offset -= begin;
      total += t.numel() * element_bytes;
      weight_map.emplace(t.name, name);
    }
    const std::size_t end = shard.back().offset + shard.back().numel();
    write_safetensors(dir / name, shard, out.values.subspan(begin, end), {}, dtype);
    written.push_back(dir / name);
  }
  if (ranges.size() > 1) {
    std::string entries;
    for (const auto& [tensor, file] : weight_map)
      entries += fmt::format("{}    {}: {}", entries.empty() ? "" : ",\n", detail::json_quote(tensor),
                             detail::json_quote(file));
    write_text(dir / detail::kHfIndexName,
               fmt::format("{{\n  \"metadata\": {{\"total_size\": {}}},\n  \"weight_map\": {{\n{}\n  }}\n}}\n",
                           total, entries));
    written.push_back(dir / detail::kHfIndexName);
  }
  // The other form's files of an earlier export.
  static const std::regex shard_name(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == detail::kHfWeightsName || name == detail::kHfIndexName ||
                      std::regex_match(name, shard_name);
    if (ours && std::find(written.begin(), written.end(), entry.path()) == written.end())
      fs::remove(entry.path(), ec);
  }
}

}  // namespace

namespace detail {

// Note [Hugging Face token ids]: a JSON array of ids in the checkpoint's metadata.
std::vector<int> recorded_ids(const Checkpoint& ckpt, const std::string& key) {
  const auto it = ckpt.metadata.find(key);
  if (it == ckpt.metadata.end()) return {};
  std::vector<int> out;
  try {
    const detail::JsonValue ids = detail::parse_json(it->second);
    if (ids.kind != detail::JsonValue::Kind::array) throw std::invalid_argument("not an array");
    for (const detail::JsonValue& id : ids.items) out.push_back(std::stoi(id.text));
  } catch (const std::exception&) {
    detail::fail_input(ckpt.weights_file, fmt::format("metadata {}: expected a JSON array of "
                                                      "token ids, got '{}'", key, it->second));
  }
  return out;
}

bool is_hf_dir(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(path / kConfigName, ec);
  return (path.filename() == kHfWeightsName || path.filename() == kHfIndexName) &&
         fs::exists(path.parent_path() / kConfigName, ec);
}

HfConfig read_hf_dir_config(const fs::path& path, fs::path& file) {
  file = dir_of(path) / kConfigName;
  return read_hf_config(file);
}

GptSpec gpt_spec_of(const HfConfig& c) {
  GptSpec spec{.vocab_size = c.vocab_size, .context = c.context, .n_layer = c.n_layer,
               .n_head = c.n_head, .d_model = c.d_model};
  if (c.is_gpt2()) return spec;
  spec.norm = NormKind::rmsnorm;
  spec.norm_eps = c.norm_eps;
  spec.positions = PositionKind::rope;
  spec.rope_theta = c.rope_theta;
  spec.rope_scaling = c.rope_scaling;
  spec.mlp = MlpKind::swiglu;
  spec.intermediate_size = c.intermediate_size;
  spec.n_kv_head = c.n_kv_head;
  spec.head_dim = c.head_dim;
  spec.qkv_bias = c.qkv_bias;
  spec.proj_bias = c.proj_bias;
  spec.tie_embeddings = c.tie_embeddings;
  return spec;
}

Weights load_hf_weights(const fs::path& path, std::span<const ParamTensor> expected) {
  fs::path config_file;
  const HfConfig config = read_hf_dir_config(path, config_file);
  HfWeights weights(dir_of(path));
  Weights out;
  out.file = weights.file();
  std::size_t count = 0;
  for (const ParamTensor& e : expected) count = std::max(count, e.offset + e.numel());
  out.params.assign(count, 0.0f);
  load_hf_tensors(weights, tensor_names(config), expected, out.params);
  out.metadata = weights.metadata();
  // Note [Hugging Face token ids].
  if (!config.bos_token_ids.empty())
    out.metadata["lockstep.bos_token_ids"] = fmt::format("[{}]", fmt::join(config.bos_token_ids, ", "));
  if (!config.eos_token_ids.empty())
    out.metadata["lockstep.eos_token_ids"] = fmt::format("[{}]", fmt::join(config.eos_token_ids, ", "));
  if (config.is_gpt2()) out.metadata["lockstep.model"] = to_string(gpt_spec_of(config));
  return out;
}

std::uint64_t parse_shard_size(std::string_view text) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  const std::string_view unit = text.substr(static_cast<std::size_t>(end - text.data()));
  constexpr std::pair<std::string_view, std::uint64_t> kUnits[] = {
      {"", 1},           {"KB", 1'000},     {"MB", 1'000'000}, {"GB", 1'000'000'000},
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}};
  if (ec == std::errc{} && n > 0)
    for (const auto& [name, scale] : kUnits)
      if (unit == name && n <= UINT64_MAX / scale) return n * scale;
  throw std::invalid_argument(fmt::format("expected a size in bytes, or with a unit (KB, MB, GB, "
                                          "KiB, MiB, GiB), as \"5GB\", got '{}'", text));
}

}  // namespace detail

void export_hf(const Checkpoint& ckpt, const fs::path& dir, TensorDtype dtype,
               const Tokenizer* tokenizer, std::uint64_t max_shard_bytes) {
  const auto model = ckpt.metadata.find("lockstep.model");
  if (model == ckpt.metadata.end() || !model->second.starts_with("gpt "))
    detail::fail_input(ckpt.weights_file,
                       fmt::format("not a GPT checkpoint ({}); the Hugging Face format (hf) "
                                   "needs model.type gpt",
                                   model == ckpt.metadata.end() ? "no lockstep.model in the metadata"
                                                                : "lockstep.model: " + model->second));
  detail::HfConfig config;
  try {
    config = hf_config_of(parse_gpt_spec(model->second));
  } catch (const std::invalid_argument& e) {
    detail::fail_input(ckpt.weights_file, e.what());
  }
  if (!config.is_gpt2() && config.proj_bias)
    detail::fail_input(ckpt.weights_file, "model.proj_bias: the Llama family's Hugging Face "
                                          "classes have no bias on the output projections");
  if (tokenizer && tokenizer->vocab_size() > static_cast<std::size_t>(config.vocab_size))
    detail::fail_input(ckpt.weights_file,
                       fmt::format("the tokenizer {} has {} ids, the model {}: not its tokenizer",
                                   tokenizer->source().string(), tokenizer->vocab_size(),
                                   config.vocab_size));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) detail::fail_input(dir, "cannot create the directory: " + ec.message());
  write_hf_weights(dir, export_tensors(ckpt, config), dtype, max_shard_bytes);
  config.bos_token_ids = detail::recorded_ids(ckpt, "lockstep.bos_token_ids");
  config.eos_token_ids = detail::recorded_ids(ckpt, "lockstep.eos_token_ids");
  if (tokenizer) {
    detail::write_hf_tokenizer(*tokenizer, dir, config.context);
    const auto eot = tokenizer->end_of_text();
    if (eot && config.bos_token_ids.empty()) config.bos_token_ids = {static_cast<int>(*eot)};
    if (eot && config.eos_token_ids.empty()) config.eos_token_ids = {static_cast<int>(*eot)};
  }
  write_text(dir / kConfigName,
             detail::hf_config_json(config, dtype == TensorDtype::bf16 ? "bfloat16" : "float32"));
  write_text(dir / kGenerationConfigName, detail::hf_generation_config_json(config));
}

}  // namespace lockstep
