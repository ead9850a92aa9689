// load_idx(): the IDX files of MNIST (big-endian header, unsigned-byte payload).
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string_view>

#include "io/open_input.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"

namespace lockstep {

namespace {

constexpr unsigned char kUnsignedByte = 0x08;

std::uint32_t read_be32(std::string_view bytes, std::size_t offset) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return v;
}

struct IdxFile {
  std::vector<std::uint32_t> dims;  // dims[0] counts the items
  std::string_view data;            // the payload, one byte per element
};

// Checks the header and the payload size; `labels` selects the 1-dimensional labels format.
IdxFile parse_idx(const std::string& name, std::string_view bytes, bool labels) {
  if (bytes.empty()) throw InputError(fmt::format("{}: empty file: expected an IDX header", name));
  if (bytes.size() < 4) {
    throw InputError(
        fmt::format("{}: truncated: expected a 4-byte IDX magic number, file has {} bytes", name,
                    bytes.size()));
  }
  const std::uint32_t magic = read_be32(bytes, 0);
  const unsigned ndims = magic & 0xffu;
  if ((magic >> 8) != kUnsignedByte || ndims == 0 || (labels && ndims != 1)) {
    throw InputError(
        fmt::format("{}: byte 0: bad magic number 0x{:08x}: expected {}", name, magic,
                    labels ? "0x00000801 (IDX unsigned-byte labels)"
                           : "0x0000080N (IDX unsigned-byte images with N >= 1 dimensions)"));
  }

  const std::size_t header = 4 + 4 * std::size_t{ndims};
  if (bytes.size() < header) {
    throw InputError(fmt::format("{}: truncated: the header needs {} bytes, file has {}", name,
                                 header, bytes.size()));
  }
  IdxFile idx;
  std::uint64_t elements = 1;
  for (unsigned d = 0; d < ndims; ++d) {
    const std::size_t offset = 4 + 4 * std::size_t{d};
    const std::uint32_t size = read_be32(bytes, offset);
    if (d > 0 && size == 0) {
      throw InputError(
          fmt::format("{}: byte {}: dimension {} is 0: expected at least 1", name, offset, d));
    }
    if (size != 0 && elements > UINT64_MAX / size) {
      throw InputError(fmt::format("{}: byte {}: the dimensions multiply to more than 2^64 bytes",
                                   name, offset));
    }
    elements *= size;
    idx.dims.push_back(size);
  }
  const std::size_t available = bytes.size() - header;
  if (available < elements) {
    throw InputError(fmt::format("{}: truncated: header says {} bytes of data, file has {}", name,
                                 elements, available));
  }
  if (available > elements) {
    throw InputError(
        fmt::format("{}: byte {}: {} unexpected bytes after the {} bytes of data "
                    "the header describes",
                    name, header + elements, available - elements, elements));
  }
  idx.data = bytes.substr(header);
  return idx;
}

}  // namespace

InMemoryDataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels) {
  const std::string images_name = images.string();
  const std::string labels_name = labels.string();
  const std::string image_bytes = detail::read_input(images, detail::InputKind::data);
  const std::string label_bytes = detail::read_input(labels, detail::InputKind::data);
  const IdxFile img = parse_idx(images_name, image_bytes, false);
  const IdxFile lab = parse_idx(labels_name, label_bytes, true);

  const std::size_t count = img.dims[0];
  if (count == 0) throw InputError(fmt::format("{}: no images: the header says 0", images_name));
  if (lab.dims[0] != count) {
    throw InputError(
        fmt::format("{}: {} images, but {} has {} labels: expected one label per image",
                    images_name, count, labels_name, lab.dims[0]));
  }
  const std::size_t features = img.data.size() / count;
  if (features > static_cast<std::size_t>(INT_MAX)) {
    throw InputError(fmt::format("{}: {} values per image: expected at most {}", images_name,
                                 features, INT_MAX));
  }

  std::vector<float> x(img.data.size());
  std::transform(img.data.begin(), img.data.end(), x.begin(),
                 [](char b) { return static_cast<float>(static_cast<unsigned char>(b)) / 255.0f; });
  std::vector<std::int32_t> y(count);
  std::transform(lab.data.begin(), lab.data.end(), y.begin(),
                 [](char b) { return static_cast<std::int32_t>(static_cast<unsigned char>(b)); });
  const std::int32_t max_label = *std::max_element(y.begin(), y.end());
  if (max_label < 1) {
    throw InputError(
        fmt::format("{}: every label is {}: expected at least 2 classes", labels_name, max_label));
  }
  return InMemoryDataset(std::move(x), std::move(y), static_cast<int>(features), max_label + 1);
}

}  // namespace lockstep
