// A decoder's description as checkpoints carry it ("lockstep.model"), and its FLOPs per token.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/model.hpp"

namespace lockstep {
namespace {

// The words after d_model, in this order, each written where it differs from GPT-2's; a parse
// reads them in any order, each once.
std::vector<std::pair<std::string, std::string>> extra_words(const GptSpec& s) {
  const GptSpec gpt2;
  std::vector<std::pair<std::string, std::string>> out;
  const auto word = [&](std::string key, std::string value, bool differs) {
    if (differs) out.emplace_back(std::move(key), std::move(value));
  };
  const auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  word("norm", std::string(to_string(s.norm)), s.norm != gpt2.norm);
  word("norm_eps", fmt::format("{}", s.norm_eps),
       s.norm == NormKind::rmsnorm || s.norm_eps != gpt2.norm_eps);
  word("positions", std::string(to_string(s.positions)), s.positions != gpt2.positions);
  word("rope_theta", fmt::format("{}", s.rope_theta), s.positions == PositionKind::rope);
  if (s.rope_scaling)
    word("rope_scaling",
         fmt::format("llama3:{},{},{},{}", s.rope_scaling->factor, s.rope_scaling->low_freq_factor,
                     s.rope_scaling->high_freq_factor,
                     s.rope_scaling->original_max_position_embeddings),
         true);
  word("mlp", std::string(to_string(s.mlp)), s.mlp != gpt2.mlp);
  word("intermediate_size", std::to_string(s.intermediate_size), s.intermediate_size != 0);
  word("n_kv_head", std::to_string(s.n_kv_head), s.n_kv_head != 0);
  word("head_dim", std::to_string(s.head_dim), s.head_dim != 0);
  word("qkv_bias", flag(s.qkv_bias), s.qkv_bias != gpt2.qkv_bias);
  word("proj_bias", flag(s.proj_bias), s.proj_bias != gpt2.proj_bias);
  word("tie_embeddings", flag(s.tie_embeddings), s.tie_embeddings != gpt2.tie_embeddings);
  return out;
}

std::optional<double> read_double(std::string_view text) {
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

std::optional<int> read_int(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

template <class E>
std::optional<E> read_enum(std::string_view text, std::initializer_list<E> values) {
  for (const E v : values)
    if (to_string(v) == text) return v;
  return std::nullopt;
}

std::optional<bool> read_bool(std::string_view text) {
  if (text == "true") return true;
  if (text == "false") return false;
  return std::nullopt;
}

// "llama3:factor,low,high,original".
std::optional<Llama3Scaling> read_scaling(std::string_view text) {
  if (!text.starts_with("llama3:")) return std::nullopt;
  text.remove_prefix(7);
  double v[4];
  for (int i = 0; i < 4; ++i) {
    const std::size_t comma = i < 3 ? text.find(',') : text.size();
    if (comma == std::string_view::npos) return std::nullopt;
    const auto x = read_double(text.substr(0, comma));
    if (!x) return std::nullopt;
    v[i] = *x;
    text.remove_prefix(std::min(text.size(), comma + 1));
  }
  return Llama3Scaling{v[0], v[1], v[2], v[3]};
}

// Reads one "key=value" word after d_model into `spec`; false for a value it cannot read.
bool read_extra(GptSpec& spec, std::string_view key, std::string_view value) {
  const auto set = [](auto& field, const auto& parsed) {
    if (parsed) field = *parsed;
    return parsed.has_value();
  };
  const auto positive = [](std::optional<int> v) {
    return v && *v > 0 ? v : std::nullopt;
  };
  if (key == "norm") return set(spec.norm, read_enum(value, {NormKind::layernorm, NormKind::rmsnorm}));
  if (key == "norm_eps") return set(spec.norm_eps, read_double(value));
  if (key == "positions")
    return set(spec.positions, read_enum(value, {PositionKind::learned, PositionKind::rope}));
  if (key == "rope_theta") return set(spec.rope_theta, read_double(value));
  if (key == "rope_scaling") {
    const auto scaling = read_scaling(value);
    if (scaling) spec.rope_scaling = scaling;
    return scaling.has_value();
  }
  if (key == "mlp") return set(spec.mlp, read_enum(value, {MlpKind::gelu, MlpKind::swiglu}));
  if (key == "intermediate_size") return set(spec.intermediate_size, positive(read_int(value)));
  if (key == "n_kv_head") return set(spec.n_kv_head, positive(read_int(value)));
  if (key == "head_dim") return set(spec.head_dim, positive(read_int(value)));
  if (key == "qkv_bias") return set(spec.qkv_bias, read_bool(value));
  if (key == "proj_bias") return set(spec.proj_bias, read_bool(value));
  if (key == "tie_embeddings") return set(spec.tie_embeddings, read_bool(value));
  throw std::out_of_range(std::string(key));
}

}  // namespace

std::string to_string(const GptSpec& spec) {
  std::string out = fmt::format("gpt vocab_size={} context={} n_layer={} n_head={} d_model={}",
                                spec.vocab_size, spec.context, spec.n_layer, spec.n_head,
                                spec.d_model);
  for (const auto& [key, value] : extra_words(spec)) out += fmt::format(" {}={}", key, value);
  return out;
}

GptSpec parse_gpt_spec(std::string_view text) {
  GptSpec spec;
  int GptSpec::*const fields[] = {&GptSpec::vocab_size, &GptSpec::context, &GptSpec::n_layer,
                                  &GptSpec::n_head, &GptSpec::d_model};
  const std::string_view names[] = {"vocab_size", "context", "n_layer", "n_head", "d_model"};
  std::string_view rest = text;
  const auto word = [&] {
    while (rest.starts_with(' ')) rest.remove_prefix(1);
    const std::size_t end = std::min(rest.find(' '), rest.size());
    const std::string_view w = rest.substr(0, end);
    rest.remove_prefix(end);
    return w;
  };
  const auto bad = [&](std::string_view what) {
    return std::invalid_argument(fmt::format(
        "model description '{}': {}; expected 'gpt vocab_size=V context=T n_layer=L n_head=H "
        "d_model=C' and optional key=value settings of the decoder's parts", text, what));
  };
  if (word() != "gpt") throw bad("not a GPT");
  for (std::size_t i = 0; i < std::size(names); ++i) {
    const std::string_view w = word();
    if (!w.starts_with(names[i]) || w.size() <= names[i].size() || w[names[i].size()] != '=')
      throw bad(fmt::format("expected {}=", names[i]));
    const auto value = read_int(w.substr(names[i].size() + 1));
    if (!value || *value < 1) throw bad(fmt::format("{} is not a positive integer", names[i]));
    spec.*fields[i] = *value;
  }
  std::vector<std::string_view> seen;
  for (std::string_view w = word(); !w.empty(); w = word()) {
    const std::size_t eq = w.find('=');
    if (eq == std::string_view::npos || eq == 0) throw bad(fmt::format("'{}' is not key=value", w));
    const std::string_view key = w.substr(0, eq), value = w.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw bad(fmt::format("{} given twice", key));
    seen.push_back(key);
    try {
      if (!read_extra(spec, key, value))
        throw bad(fmt::format("{}={} is not a value of {}", key, value, key));
    } catch (const std::out_of_range&) {
      throw bad(fmt::format("unknown setting '{}'", key));
    }
  }
  return spec;
}

double gpt_flops_per_token(const GptSpec& spec) {
  const double c = spec.d_model, l = spec.n_layer, t = spec.context;
  if (!spec.llama_parts()) {
    const double block = 12.0 * c * c + 13.0 * c;
    const double matmul_params = double(spec.vocab_size) * c + l * block + 2.0 * c;
    return 6.0 * matmul_params + 12.0 * l * c * t;
  }
  const double q = double(spec.n_head) * spec.head_size();
  const double kv = double(spec.kv_heads()) * spec.head_size(), f = spec.hidden_size();
  const double attention = c * (q + 2.0 * kv) + (spec.qkv_bias ? q + 2.0 * kv : 0.0) + q * c +
                           (spec.proj_bias ? c : 0.0);
  const double mlp = 3.0 * c * f + (spec.proj_bias ? 2.0 * f + c : 0.0);
  const double block = attention + mlp + 2.0 * c;  // and the two RMSNorms
  // The LM head's (V, C) multiplies, tied or not; an untied embedding is a lookup.
  const double matmul_params = double(spec.vocab_size) * c + l * block + c;
  return 6.0 * matmul_params + 12.0 * l * q * t;
}

}  // namespace lockstep
