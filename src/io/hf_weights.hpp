// The weights of a Hugging Face model directory: model.safetensors, or the shards that
// model.safetensors.index.json's weight_map names (Note [Hugging Face shards] in
// hf_weights.cpp), loaded tensor by tensor into lockstep's parameter buffer.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors_reader.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

inline constexpr std::string_view kHfWeightsName = "model.safetensors";
inline constexpr std::string_view kHfIndexName = "model.safetensors.index.json";

// The tensors of a directory's files, every shard's header read and checked against the index;
// or of one safetensors file (lockstep's own, an export).
class HfWeights {
 public:
  // `path`: a directory or a file. InputError naming the file: no weights (neither
  // model.safetensors nor the index), an index whose weight_map names a file that is not there
  // or a tensor its shard does not hold, a shard holding a tensor the weight_map puts elsewhere.
  explicit HfWeights(const std::filesystem::path& path);

  struct Located {
    SafetensorsReader* shard;
    const StoredTensor* tensor;
  };
  // Every tensor of every shard, in the shards' order and each shard's data order.
  const std::vector<Located>& tensors() const noexcept { return tensors_; }
  // The file a message names for the whole: the index, or model.safetensors.
  const std::filesystem::path& file() const noexcept { return file_; }
  // The first shard's metadata (lockstep's exports record lockstep.* keys there).
  const std::map<std::string, std::string>& metadata() const { return shards_.front()->metadata(); }

 private:
  std::filesystem::path file_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::vector<Located> tensors_;
};

// How a family names its tensors in Hugging Face's files.
struct HfTensorNames {
  // lockstep's name for the file's tensor `name`; "" for a buffer that is no parameter (GPT-2's
  // causal masks), which is skipped.
  std::function<std::string(std::string_view name)> to_lockstep;
  // Whether lockstep's tensor `name` is stored transposed ((in, out), GPT-2's Conv1D).
  std::function<bool(std::string_view name)> transposed;
};

// Fills `params` (sized to hold `expected`) from `weights`, each tensor read straight into its
// place (a transposed one through a buffer of its own size). InputError naming the shard and
// the tensor: one the model lacks (never skipped), one of another shape (both named), one of a
// dtype other than F32, BF16 or F16, one the model has and the files do not.
void load_hf_tensors(HfWeights& weights, const HfTensorNames& names,
                     std::span<const ParamTensor> expected, std::span<float> params);

}  // namespace lockstep::detail
