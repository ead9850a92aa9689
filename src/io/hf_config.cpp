// Reading and writing Hugging Face config.json files.
//
// Note [Hugging Face config.json]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// config.json names the architecture (model_type, architectures) and its sizes; lockstep's
// decoder is described by model keys (model.family and the parts it presets). The fields map:
//
//   GPT2LMHeadModel     n_positions -> context, n_embd -> d_model, n_layer, n_head, vocab_size;
//                       activation_function must be gelu_new (the tanh GELU), layer_norm_epsilon
//                       is the LayerNorm's eps, the head is tied to wte.
//   LlamaForCausalLM,   hidden_size -> d_model, num_hidden_layers -> n_layer,
//   Qwen2ForCausalLM,   num_attention_heads -> n_head, num_key_value_heads -> n_kv_head (n_head
//   MistralForCausalLM  when absent), head_dim (d_model / n_head when absent), intermediate_size,
//                       rms_norm_eps -> norm_eps, rope_theta, rope_scaling (or transformers 5's
//                       rope_parameters, which holds rope_theta too) of type llama3,
//                       tie_word_embeddings, max_position_embeddings -> context. Biases: Llama's
//                       attention_bias puts one on q, k, v and o (qkv_bias and proj_bias);
//                       Qwen2 always has q, k, v biases and no o bias; Mistral none.
//
// The context a rotary model trains at is the run's choice, not the weights': max_position_-
// embeddings is the default, as GPT-2's n_positions is, but a config may set a smaller one
// (train.cpp compares). What lockstep does not compute is refused by name, never dropped: an
// activation other than silu, rope types other than llama3 (linear, dynamic, yarn, ...), an
// MLP bias, q/k norms, mixtures of experts, and sliding-window attention where it would take
// effect (Qwen2's use_sliding_window; Mistral's sliding_window below the run's context:
// WeightsModel::max_context). bos_token_id and eos_token_id may be an int, a list or null.
#include "io/hf_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>

#include "io/durable_file.hpp"
#include "io/json.hpp"

namespace lockstep::detail {
namespace fs = std::filesystem;
namespace {

using Kind = JsonValue::Kind;

struct Family {
  std::string_view model_type, architecture;
};
constexpr Family kFamilies[] = {{"gpt2", "GPT2LMHeadModel"},
                                {"llama", "LlamaForCausalLM"},
                                {"qwen2", "Qwen2ForCausalLM"},
                                {"mistral", "MistralForCausalLM"}};

// config.json's fields, each read with the file and the field named in any error.
class ConfigJson {
 public:
  ConfigJson(const JsonValue& root, const fs::path& file) : root_(root), file_(file) {}

  [[noreturn]] void fail(std::string_view key, std::string_view what) const {
    fail_input(file_, fmt::format("{}: {}", key, what));
  }

  // The field, or nullptr when it is absent or null.
  const JsonValue* find(std::string_view key) const { return find_in(root_, key); }
  static const JsonValue* find_in(const JsonValue& object, std::string_view key) {
    for (const auto& [name, value] : object.members)
      if (name == key) return value.kind == Kind::null ? nullptr : &value;
    return nullptr;
  }

  double number(const JsonValue& v, std::string_view key) const {
    if (v.kind != Kind::number) fail(key, fmt::format("expected a number, got {}", v.kind_name()));
    return std::strtod(v.text.c_str(), nullptr);
  }
  int positive_int(const JsonValue& v, std::string_view key) const {
    const double x = number(v, key);
    if (x < 1 || x != std::floor(x) || x > 1e9)
      fail(key, fmt::format("expected a positive integer, got {}", v.text));
    return static_cast<int>(x);
  }
  int positive_int(std::string_view key, std::string_view family) const {
    const JsonValue* v = find(key);
    if (!v) fail(key, fmt::format("missing (a {} config.json has it)", family));
    return positive_int(*v, key);
  }
  std::optional<int> optional_int(std::string_view key) const {
    const JsonValue* v = find(key);
    return v ? std::optional(positive_int(*v, key)) : std::nullopt;
  }
  double positive_number(std::string_view key, double absent) const {
    const JsonValue* v = find(key);
    if (!v) return absent;
    const double x = number(*v, key);
    if (!(x > 0) || !std::isfinite(x)) fail(key, fmt::format("expected a positive number, got {}", v->text));
    return x;
  }
  bool boolean(std::string_view key, bool absent) const {
    const JsonValue* v = find(key);
    if (!v) return absent;
    if (v->kind != Kind::boolean) fail(key, fmt::format("expected true or false, got {}", v->kind_name()));
    return v->boolean;
  }
  std::string string(std::string_view key) const {
    const JsonValue* v = find(key);
    if (!v) return {};
    if (v->kind != Kind::string) fail(key, fmt::format("expected a string, got {}", v->kind_name()));
    return v->text;
  }
  // An int, a list of ints, or null.
  std::vector<int> token_ids(std::string_view key) const {
    const JsonValue* v = find(key);
    if (!v) return {};
    if (v->kind != Kind::array) return {non_negative_int(*v, key)};
    std::vector<int> out;
    for (const JsonValue& item : v->items) out.push_back(non_negative_int(item, key));
    return out;
  }

 private:
  int non_negative_int(const JsonValue& v, std::string_view key) const {
    const double x = v.kind == Kind::number ? std::strtod(v.text.c_str(), nullptr) : -1;
    if (x < 0 || x != std::floor(x) || x > 1e9)
      fail(key, fmt::format("expected a token id (an integer >= 0) or a list of them, got {} {}",
                            v.kind_name(), v.text));
    return static_cast<int>(x);
  }

  const JsonValue& root_;
  const fs::path& file_;
};

// The family config.json describes, from model_type or else architectures; a file with neither
// is GPT-2's (lockstep's first exports wrote no model_type).
const Family& family_of(const ConfigJson& json) {
  const std::string model_type = json.string("model_type");
  std::string architecture;
  if (const JsonValue* list = json.find("architectures")) {
    if (list->kind != Kind::array || list->items.size() != 1 || list->items[0].kind != Kind::string)
      json.fail("architectures", "expected a list of one class name");
    architecture = list->items[0].text;
  }
  std::vector<std::string_view> known;
  for (const Family& f : kFamilies) {
    if (model_type.empty() ? architecture == f.architecture || architecture.empty()
                           : model_type == f.model_type) {
      if (!architecture.empty() && architecture != f.architecture)
        json.fail("architectures", fmt::format("expected [\"{}\"] for model_type \"{}\" (the "
                                               "causal language model lockstep trains), got "
                                               "[\"{}\"]", f.architecture, f.model_type,
                                               architecture));
      return f;
    }
    known.push_back(f.model_type);
  }
  if (!model_type.empty())
    json.fail("model_type", fmt::format("expected one of {} (the architectures lockstep models), "
                                        "got \"{}\"", fmt::join(known, ", "), model_type));
  json.fail("architectures", fmt::format("expected GPT2LMHeadModel, LlamaForCausalLM, "
                                         "Qwen2ForCausalLM or MistralForCausalLM, got [\"{}\"]",
                                         architecture));
}

// Fields that describe parts lockstep does not model, refused when they take effect.
void refuse_unmodelled(const ConfigJson& json, const HfConfig& out) {
  for (const std::string_view key : {"num_experts", "num_local_experts", "n_routed_experts",
                                     "moe_intermediate_size", "num_experts_per_tok"})
    if (const JsonValue* v = json.find(key); v && !(v->kind == Kind::number && v->text == "0"))
      json.fail(key, "a mixture of experts, which lockstep does not model");
  for (const std::string_view key : {"qk_norm", "use_qk_norm"})
    if (json.boolean(key, false)) json.fail(key, "q/k norms, which lockstep does not model");
  if (json.boolean("mlp_bias", false))
    json.fail("mlp_bias", "expected false: lockstep's SwiGLU has no biases");
  if (json.boolean("use_sliding_window", false))
    json.fail("use_sliding_window", "expected false: lockstep does not model sliding-window "
                                    "attention");
  if (const std::string act = json.string("hidden_act"); !act.empty() && act != "silu")
    json.fail("hidden_act", fmt::format("expected \"silu\" (the SwiGLU lockstep computes), got "
                                        "\"{}\"", act));
  if (out.n_head % out.n_kv_head != 0)
    json.fail("num_key_value_heads", fmt::format("expected a divisor of num_attention_heads "
                                                 "({}), got {}", out.n_head, out.n_kv_head));
}

// rope_scaling, or transformers 5's rope_parameters (which carries rope_theta as well).
void read_rope(const ConfigJson& json, HfConfig& out) {
  out.rope_theta = json.positive_number("rope_theta", 10000);
  for (const std::string_view key : {"rope_scaling", "rope_parameters"}) {
    const JsonValue* rope = json.find(key);
    if (!rope) continue;
    if (rope->kind != Kind::object) json.fail(key, fmt::format("expected an object, got {}", rope->kind_name()));
    const auto field = [&](std::string_view name) { return fmt::format("{}.{}", key, name); };
    const JsonValue* type = ConfigJson::find_in(*rope, "rope_type");
    if (!type) type = ConfigJson::find_in(*rope, "type");
    const std::string kind = type && type->kind == Kind::string ? type->text : "";
    if (const JsonValue* theta = ConfigJson::find_in(*rope, "rope_theta")) {
      out.rope_theta = json.number(*theta, field("rope_theta"));
      if (!(out.rope_theta > 0)) json.fail(field("rope_theta"), "expected a positive number");
    }
    if (kind == "default") continue;
    if (kind != "llama3")
      json.fail(field("rope_type"), fmt::format("expected \"llama3\" or \"default\" (the RoPE "
                                                "scalings lockstep computes), got {}",
                                                type ? type->text : "none"));
    Llama3Scaling s;
    const auto need = [&](std::string_view name) -> const JsonValue& {
      const JsonValue* v = ConfigJson::find_in(*rope, name);
      if (!v) json.fail(field(name), "missing (llama3 scaling needs factor, low_freq_factor, "
                                     "high_freq_factor and original_max_position_embeddings)");
      return *v;
    };
    s.factor = json.number(need("factor"), field("factor"));
    s.low_freq_factor = json.number(need("low_freq_factor"), field("low_freq_factor"));
    s.high_freq_factor = json.number(need("high_freq_factor"), field("high_freq_factor"));
    s.original_max_position_embeddings =
        json.positive_int(need("original_max_position_embeddings"),
                          field("original_max_position_embeddings"));
    if (!(s.factor >= 1) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor))
      json.fail(key, "expected factor >= 1 and 0 < low_freq_factor < high_freq_factor");
    out.rope_scaling = s;
  }
}

HfConfig read_llama_family(const ConfigJson& json, const Family& family) {
  const std::string_view name = family.architecture;
  HfConfig out;
  out.family = family.model_type;
  out.architecture = name;
  out.vocab_size = json.positive_int("vocab_size", name);
  out.context = json.positive_int("max_position_embeddings", name);
  out.n_layer = json.positive_int("num_hidden_layers", name);
  out.n_head = json.positive_int("num_attention_heads", name);
  out.d_model = json.positive_int("hidden_size", name);
  out.intermediate_size = json.positive_int("intermediate_size", name);
  out.n_kv_head = json.optional_int("num_key_value_heads").value_or(out.n_head);
  if (const std::optional<int> head_dim = json.optional_int("head_dim")) {
    out.head_dim = *head_dim;
  } else {
    if (out.d_model % out.n_head != 0)
      json.fail("hidden_size", fmt::format("expected a multiple of num_attention_heads ({}) when "
                                           "head_dim is absent, got {}", out.n_head, out.d_model));
    out.head_dim = out.d_model / out.n_head;
  }
  out.norm_eps = json.positive_number("rms_norm_eps", 1e-6);
  read_rope(json, out);
  out.tie_embeddings = json.boolean("tie_word_embeddings", false);
  if (family.model_type == "llama") {
    out.qkv_bias = out.proj_bias = json.boolean("attention_bias", false);
  } else if (family.model_type == "qwen2") {
    out.qkv_bias = true;
  }
  if (family.model_type == "mistral") out.sliding_window = json.optional_int("sliding_window");
  refuse_unmodelled(json, out);
  return out;
}

HfConfig read_gpt2(const ConfigJson& json) {
  constexpr std::string_view name = "GPT-2";
  if (const std::string act = json.string("activation_function"); !act.empty() && act != "gelu_new")
    json.fail("activation_function", fmt::format("expected \"gelu_new\" (the tanh GELU lockstep "
                                                 "computes), got \"{}\"", act));
  HfConfig out;
  out.family = "gpt2";
  out.architecture = "GPT2LMHeadModel";
  out.vocab_size = json.positive_int("vocab_size", name);
  out.context = json.positive_int("n_positions", name);
  out.n_layer = json.positive_int("n_layer", name);
  out.n_head = json.positive_int("n_head", name);
  out.d_model = json.positive_int("n_embd", name);
  out.n_kv_head = out.n_head;
  out.head_dim = out.d_model / out.n_head;
  out.intermediate_size = 4 * out.d_model;
  out.norm_eps = json.positive_number("layer_norm_epsilon", 1e-5);
  return out;
}

// A double as JSON and YAML read it back: the shortest text that round-trips.
std::string number_text(double x) { return fmt::format("{}", x); }

std::string ids_json(const std::vector<int>& ids) {
  return ids.size() == 1 ? std::to_string(ids[0]) : fmt::format("[{}]", fmt::join(ids, ", "));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> HfConfig::model_keys() const {
  std::vector<std::pair<std::string, std::string>> keys = {
      {"vocab_size", std::to_string(vocab_size)}, {"context", std::to_string(context)},
      {"n_layer", std::to_string(n_layer)},       {"n_head", std::to_string(n_head)},
      {"d_model", std::to_string(d_model)}};
  if (is_gpt2()) return keys;
  const auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  keys.insert(keys.begin(), {"family", family});
  keys.insert(keys.end(), {{"norm", "rmsnorm"},
                           {"norm_eps", number_text(norm_eps)},
                           {"positions", "rope"},
                           {"rope_theta", number_text(rope_theta)},
                           {"rope_scaling.type", rope_scaling ? "llama3" : "none"},
                           {"mlp", "swiglu"},
                           {"intermediate_size", std::to_string(intermediate_size)},
                           {"n_kv_head", std::to_string(n_kv_head)},
                           {"head_dim", std::to_string(head_dim)},
                           {"qkv_bias", flag(qkv_bias)},
                           {"proj_bias", flag(proj_bias)},
                           {"tie_embeddings", flag(tie_embeddings)}});
  if (rope_scaling)
    keys.insert(keys.end(), {{"rope_scaling.factor", number_text(rope_scaling->factor)},
                             {"rope_scaling.low_freq_factor", number_text(rope_scaling->low_freq_factor)},
                             {"rope_scaling.high_freq_factor", number_text(rope_scaling->high_freq_factor)},
                             {"rope_scaling.original_max_position_embeddings",
                              number_text(rope_scaling->original_max_position_embeddings)}});
  return keys;
}

JsonValue read_json_file(const fs::path& file) {
  InputFile in(file);
  std::string text(in.size(), '\0');
  in.read(std::as_writable_bytes(std::span(text)), "JSON");
  try {
    return parse_json(text);
  } catch (const JsonError& e) {
    fail_input(file, fmt::format("offset {}: {}", e.offset(), e.what()));
  }
}

HfConfig read_hf_config(const fs::path& file) {
  const JsonValue root = read_json_file(file);
  if (root.kind != Kind::object) fail_input(file, "expected a JSON object");
  const ConfigJson json(root, file);
  const Family& family = family_of(json);
  HfConfig out = family.model_type == "gpt2" ? read_gpt2(json) : read_llama_family(json, family);
  out.bos_token_ids = json.token_ids("bos_token_id");
  out.eos_token_ids = json.token_ids("eos_token_id");
  return out;
}

std::string hf_config_json(const HfConfig& c, std::string_view torch_dtype) {
  std::vector<std::string> fields = {
      fmt::format("\"architectures\": [\"{}\"]", c.architecture),
      fmt::format("\"model_type\": \"{}\"", c.family),
      fmt::format("\"vocab_size\": {}", c.vocab_size)};
  if (c.is_gpt2()) {
    fields.insert(fields.end(),
                  {fmt::format("\"n_positions\": {}", c.context), fmt::format("\"n_ctx\": {}", c.context),
                   fmt::format("\"n_embd\": {}", c.d_model), fmt::format("\"n_layer\": {}", c.n_layer),
                   fmt::format("\"n_head\": {}", c.n_head), "\"activation_function\": \"gelu_new\"",
                   fmt::format("\"layer_norm_epsilon\": {}", number_text(c.norm_eps)),
                   "\"resid_pdrop\": 0.0", "\"embd_pdrop\": 0.0", "\"attn_pdrop\": 0.0"});
  } else {
    fields.insert(fields.end(),
                  {fmt::format("\"max_position_embeddings\": {}", c.context),
                   fmt::format("\"hidden_size\": {}", c.d_model),
                   fmt::format("\"intermediate_size\": {}", c.intermediate_size),
                   fmt::format("\"num_hidden_layers\": {}", c.n_layer),
                   fmt::format("\"num_attention_heads\": {}", c.n_head),
                   fmt::format("\"num_key_value_heads\": {}", c.n_kv_head),
                   fmt::format("\"head_dim\": {}", c.head_dim), "\"hidden_act\": \"silu\"",
                   fmt::format("\"rms_norm_eps\": {}", number_text(c.norm_eps)),
                   fmt::format("\"rope_theta\": {}", number_text(c.rope_theta)),
                   "\"attention_dropout\": 0.0"});
    if (c.rope_scaling)
      fields.push_back(fmt::format(
          "\"rope_scaling\": {{\"rope_type\": \"llama3\", \"factor\": {}, \"low_freq_factor\": {}, "
          "\"high_freq_factor\": {}, \"original_max_position_embeddings\": {}}}",
          number_text(c.rope_scaling->factor), number_text(c.rope_scaling->low_freq_factor),
          number_text(c.rope_scaling->high_freq_factor),
          number_text(c.rope_scaling->original_max_position_embeddings)));
    else
      fields.push_back("\"rope_scaling\": null");
    if (c.family == "llama")
      fields.insert(fields.end(), {fmt::format("\"attention_bias\": {}", c.qkv_bias), "\"mlp_bias\": false"});
    if (c.family == "qwen2") fields.push_back("\"use_sliding_window\": false");
    if (c.family != "llama") fields.push_back("\"sliding_window\": null");
  }
  fields.push_back(fmt::format("\"tie_word_embeddings\": {}", c.tie_embeddings));
  if (!c.bos_token_ids.empty()) fields.push_back("\"bos_token_id\": " + ids_json(c.bos_token_ids));
  if (!c.eos_token_ids.empty()) fields.push_back("\"eos_token_id\": " + ids_json(c.eos_token_ids));
  fields.push_back(fmt::format("\"torch_dtype\": \"{}\"", torch_dtype));
  return fmt::format("{{\n  {}\n}}\n", fmt::join(fields, ",\n  "));
}

std::string hf_generation_config_json(const HfConfig& c) {
  std::vector<std::string> fields = {"\"_from_model_config\": true"};
  if (!c.bos_token_ids.empty()) fields.push_back("\"bos_token_id\": " + ids_json(c.bos_token_ids));
  if (!c.eos_token_ids.empty()) fields.push_back("\"eos_token_id\": " + ids_json(c.eos_token_ids));
  return fmt::format("{{\n  {}\n}}\n", fmt::join(fields, ",\n  "));
}

}  // namespace lockstep::detail
