// `lockstep export --format torch`, and the standardisation metadata an MLP's inputs need.
#include <fmt/format.h>

#include <algorithm>
#include <system_error>

#include "io/durable_file.hpp"
#include "io/file_roles.hpp"
#include "io/json.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

constexpr const char* kMeanKey = "lockstep.normalize.mean";
constexpr const char* kStdKey = "lockstep.normalize.std";

// A JSON array of numbers; 9 significant digits read back as the same float.
std::string json_array(std::span<const float> values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i)
    out += fmt::format("{}{:.9g}", i ? ", " : "", values[i]);
  return out + "]";
}

std::vector<float> read_array(const std::string& key, const std::string& text) {
  std::vector<float> out;
  try {
    const detail::JsonValue array = detail::parse_json(text);
    if (array.kind != detail::JsonValue::Kind::array) throw std::invalid_argument("not an array");
    for (const detail::JsonValue& item : array.items) {
      if (item.kind != detail::JsonValue::Kind::number) throw std::invalid_argument("not a number");
      out.push_back(std::stof(item.text));
    }
  } catch (const std::exception& e) {
    throw InputError(fmt::format("metadata {}: expected a JSON array of numbers ({})", key, e.what()));
  }
  return out;
}

}  // namespace

void record_standardization(std::map<std::string, std::string>& metadata,
                            std::span<const float> mean, std::span<const float> std) {
  metadata[kMeanKey] = json_array(mean);
  metadata[kStdKey] = json_array(std);
}

std::optional<Standardization> read_standardization(
    const std::map<std::string, std::string>& metadata) {
  const auto mean = metadata.find(kMeanKey), std = metadata.find(kStdKey);
  if (mean == metadata.end() && std == metadata.end()) return std::nullopt;
  if (mean == metadata.end() || std == metadata.end())
    throw InputError(fmt::format("metadata: {} and {} come together", kMeanKey, kStdKey));
  Standardization out{read_array(kMeanKey, mean->second), read_array(kStdKey, std->second)};
  if (out.mean.size() != out.std.size())
    throw InputError(fmt::format("metadata: {} has {} values, {} has {}", kMeanKey,
                                 out.mean.size(), kStdKey, out.std.size()));
  return out;
}

void export_torch(const Checkpoint& ckpt, const fs::path& file, TensorDtype dtype) {
  std::error_code ec;
  const fs::path dir = detail::directory_of(file);
  if (!fs::is_directory(dir, ec))
    detail::fail_input(file, fmt::format("directory '{}' does not exist", dir.string()));
  std::vector<ParamTensor> tensors = ckpt.tensors;
  std::vector<float> values = ckpt.params;
  if (const std::optional<Standardization> s = read_standardization(ckpt.metadata)) {
    for (const auto& [name, v] : {std::pair{"normalize.mean", &s->mean}, {"normalize.std", &s->std}}) {
      tensors.push_back({name, values.size(), {static_cast<std::int64_t>(v->size())}});
      values.insert(values.end(), v->begin(), v->end());
    }
  }
  // The checkpoint's metadata (its architecture, for one) travels along; the writer replaces
  // the format, version and checksum entries with its own.
  write_safetensors(file, tensors, values, ckpt.metadata, dtype);
}

}  // namespace lockstep
