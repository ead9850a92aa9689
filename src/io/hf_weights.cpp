// Hugging Face weight directories, single-file or sharded, loaded tensor by tensor.
//
// Note [Hugging Face shards]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// save_pretrained writes model.safetensors, or above max_shard_size (5GB by default) the shards
// model-00001-of-0000N.safetensors and model.safetensors.index.json:
//
//   {"metadata": {"total_size": 2471645608},
//    "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}
//
// The index and the shards' headers must agree: every tensor the weight_map names is in the
// shard it names, and every shard's tensor is in the weight_map under that shard. Checkpoints
// of the Hub are BF16 more often than F32; each tensor is widened to fp32 as it is read, straight
// into the parameter buffer, so that loading a model takes its fp32 size in host memory and no
// more (a transposed GPT-2 weight passes through a buffer of its own size). Tensors are read in
// the files' order, one shard after the other.
#include "io/hf_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <system_error>

#include "io/hf_config.hpp"
#include "io/json.hpp"

namespace lockstep::detail {
namespace fs = std::filesystem;
namespace {

std::string shape_text(std::span<const std::int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// weight_map of the index: tensor -> shard file name.
std::map<std::string, std::string> read_weight_map(const fs::path& index) {
  const JsonValue root = read_json_file(index);
  const JsonValue* map = nullptr;
  if (root.kind == JsonValue::Kind::object)
    for (const auto& [key, value] : root.members)
      if (key == "weight_map") map = &value;
  if (!map || map->kind != JsonValue::Kind::object)
    fail_input(index, "weight_map: expected an object of tensor names to shard files");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : map->members) {
    if (file.kind != JsonValue::Kind::string || file.text.empty() ||
        fs::path(file.text).filename() != fs::path(file.text))
      fail_input(index, fmt::format("weight_map: tensor '{}': expected the name of a file beside "
                                    "the index, got {} {}", tensor, file.kind_name(), file.text));
    out.emplace(tensor, file.text);
  }
  return out;
}

}  // namespace

HfWeights::HfWeights(const fs::path& path) {
  std::error_code ec;
  const fs::path& dir = path;
  const fs::path index = dir / kHfIndexName;
  if (!fs::is_directory(path, ec)) {
    file_ = path;
    shards_.push_back(std::make_unique<SafetensorsReader>(file_));
  } else if (!fs::exists(index, ec)) {
    file_ = dir / kHfWeightsName;
    if (!fs::exists(file_, ec))
      fail_input(dir, fmt::format("no weights: expected {} or {} (a Hugging Face model "
                                  "directory)", kHfWeightsName, kHfIndexName));
    shards_.push_back(std::make_unique<SafetensorsReader>(file_));
  } else {
    file_ = index;
    const std::map<std::string, std::string> weight_map = read_weight_map(index);
    std::map<std::string, SafetensorsReader*> by_file;
    for (const auto& [tensor, name] : weight_map) {
      if (by_file.contains(name)) continue;
      if (!fs::exists(dir / name, ec))
        fail_input(index, fmt::format("weight_map: tensor '{}' is in {}, which does not exist in "
                                      "{}", tensor, name, dir.string()));
      shards_.push_back(std::make_unique<SafetensorsReader>(dir / name));
      by_file.emplace(name, shards_.back().get());
    }
    if (shards_.empty()) fail_input(index, "weight_map: empty; expected the model's tensors");
    std::sort(shards_.begin(), shards_.end(),
              [](const auto& a, const auto& b) { return a->file() < b->file(); });
    for (const auto& [tensor, name] : weight_map)
      if (!by_file.at(name)->find(tensor))
        fail_input(dir / name, fmt::format("tensor '{}': missing, though {}'s weight_map puts it "
                                           "in this file", tensor, kHfIndexName));
    for (const auto& shard : shards_)
      for (const StoredTensor& t : shard->tensors()) {
        const auto it = weight_map.find(t.name);
        if (it == weight_map.end() || dir / it->second != shard->file())
          fail_input(shard->file(), fmt::format("tensor '{}': {}'s weight_map puts it {}", t.name,
                                                kHfIndexName, it == weight_map.end()
                                                    ? std::string("nowhere")
                                                    : "in " + it->second));
      }
  }
  for (const auto& shard : shards_)
    for (const StoredTensor& t : shard->tensors()) tensors_.push_back({shard.get(), &t});
}

void load_hf_tensors(HfWeights& weights, const HfTensorNames& names,
                     std::span<const ParamTensor> expected, std::span<float> params) {
  std::map<std::string_view, const ParamTensor*> wanted;
  for (const ParamTensor& e : expected) wanted.emplace(e.name, &e);
  std::map<std::string_view, const fs::path*> loaded;
  std::vector<float> transposed;
  for (const auto& [shard, t] : weights.tensors()) {
    const std::string name = names.to_lockstep(t->name);
    if (name.empty()) continue;
    const auto it = wanted.find(name);
    if (it == wanted.end())
      fail_input(shard->file(), fmt::format("tensor '{}' (shape {}): not in the config's model; "
                                            "lockstep loads no tensor it does not model", t->name,
                                            shape_text(t->shape)));
    const ParamTensor& e = *it->second;
    const auto [at, first] = loaded.emplace(e.name, &shard->file());
    if (!first)
      fail_input(shard->file(), fmt::format("tensor '{}': a second copy of lockstep's '{}' (the "
                                            "first is in {})", t->name, e.name,
                                            at->second->string()));
    const bool transpose = names.transposed(e.name) && e.shape.size() == 2;
    std::vector<std::int64_t> want = e.shape;
    if (transpose) std::swap(want[0], want[1]);
    if (t->shape != want)
      fail_input(shard->file(), fmt::format("tensor '{}': shape {} in the file, {} in the "
                                            "config's model{}", t->name, shape_text(t->shape),
                                            shape_text(want), transpose ? " (a Conv1D weight, "
                                            "stored (in, out))" : ""));
    const std::span<float> into = params.subspan(e.offset, e.numel());
    if (!transpose) {
      shard->read(*t, into);
      continue;
    }
    transposed.resize(e.numel());
    shard->read(*t, transposed);
    const auto rows = static_cast<std::size_t>(e.shape[0]), cols = static_cast<std::size_t>(e.shape[1]);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) into[r * cols + c] = transposed[c * rows + r];
  }
  for (const ParamTensor& e : expected)
    if (!loaded.contains(e.name))
      fail_input(weights.file(), fmt::format("tensor '{}': missing; the config's model has shape "
                                             "{}", e.name, shape_text(e.shape)));
}

}  // namespace lockstep::detail
