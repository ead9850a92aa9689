// A safetensors file read one tensor at a time, for weights that are not lockstep's own
// (Hugging Face checkpoints: BF16 or F16 as often as F32, in shards of gigabytes):
//
//   detail::SafetensorsReader shard("model-00001-of-00002.safetensors");
//   if (const detail::StoredTensor* t = shard.find("model.norm.weight"))
//     shard.read(*t, std::span(params).subspan(offset, t->numel()));
//
// The header is read and checked whole when the file is opened (as read_safetensors checks it:
// the tensors tile the data section), the data only by read(), each tensor widened to fp32
// straight into the caller's buffer: a model is never held twice in host memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/durable_file.hpp"

namespace lockstep::detail {

// One tensor of the header. `dtype` is the file's name for it ("F32", "BF16", "I64", ...): any
// dtype of a known size is listed (a checkpoint's integer buffers among them), but read() takes
// the floating-point ones alone.
struct StoredTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // bytes into the data section
  std::size_t numel() const;
};

class SafetensorsReader {
 public:
  // Reads and checks the header; InputError naming the file and what is wrong with it. A file
  // that lockstep wrote (its metadata has lockstep.checksum or lockstep.file_checksum) is also
  // checked against them, reading the data once in pieces.
  explicit SafetensorsReader(std::filesystem::path file);

  const std::filesystem::path& file() const noexcept { return in_.path(); }
  const std::vector<StoredTensor>& tensors() const noexcept { return tensors_; }  // by offset
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const StoredTensor* find(std::string_view name) const;

  // `t`'s values, widened exactly to fp32 from F32, BF16 or F16, into `out` (t.numel() floats).
  // InputError naming the file and the tensor for another dtype.
  void read(const StoredTensor& t, std::span<float> out);

 private:
  InputFile in_;
  std::uint64_t data_start_ = 0;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The fp32 value of an IEEE half (exact: every half is a float).
float f16_to_float(std::uint16_t h);

}  // namespace lockstep::detail
