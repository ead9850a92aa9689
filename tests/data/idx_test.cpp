#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "temp_files.hpp"

using lockstep::InputError;
using lockstep::load_idx;
using lockstep::test::TempDir;

namespace {

// An IDX file: the magic number and dimensions big-endian, then the payload.
std::string idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                      const std::vector<std::uint8_t>& data) {
  std::string out;
  auto put32 = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put32(magic);
  for (const std::uint32_t d : dims) put32(d);
  out.append(data.begin(), data.end());
  return out;
}

const std::vector<std::uint8_t> kPixels{0, 255, 51, 102, 1, 2, 3, 4, 10, 20, 30, 40};
const std::string kImages = idx_bytes(0x00000803, {3, 2, 2}, kPixels);
const std::string kLabels = idx_bytes(0x00000801, {3}, {0, 2, 1});

// The message load_idx() throws for these files' bytes.
std::string idx_error(const std::string& images, const std::string& labels) {
  TempDir dir;
  const auto image_file = dir.write("images", images);
  const auto label_file = dir.write("labels", labels);
  try {
    load_idx(image_file, label_file);
  } catch (const InputError& e) {
    std::string what = e.what();
    // Name the files generically so the expectations do not depend on the temp directory.
    for (const auto& [file, name] : {std::pair{image_file.string(), std::string("IMAGES")},
                                     std::pair{label_file.string(), std::string("LABELS")}}) {
      for (auto at = what.find(file); at != std::string::npos; at = what.find(file)) {
        what.replace(at, file.size(), name);
      }
    }
    return what;
  }
  return "";
}

}  // namespace

TEST_CASE("load_idx: round trip") {
  TempDir dir;
  const auto d = load_idx(dir.write("images", kImages), dir.write("labels", kLabels));
  CHECK(d.size() == 3);
  CHECK(d.features() == 4);
  CHECK(d.classes() == 3);
  for (std::size_t i = 0; i < kPixels.size(); ++i) {
    CHECK(d.x()[i] == doctest::Approx(kPixels[i] / 255.0));
  }
  CHECK(d.x()[1] == 1.0f);
  CHECK(std::vector<std::int32_t>(d.y().begin(), d.y().end()) ==
        std::vector<std::int32_t>{0, 2, 1});

  // One-dimensional "images" are single features.
  const auto flat = load_idx(dir.write("flat", idx_bytes(0x00000801, {3}, {7, 8, 9})),
                             dir.write("labels", kLabels));
  CHECK(flat.features() == 1);
}

TEST_CASE("load_idx: errors name the file, the byte and what was expected") {
  CHECK(idx_error(kImages, kImages) ==
        "LABELS: byte 0: bad magic number 0x00000803: expected 0x00000801 (IDX unsigned-byte "
        "labels)");
  CHECK(idx_error(idx_bytes(0x00000d03, {3, 2, 2}, kPixels), kLabels) ==
        "IMAGES: byte 0: bad magic number 0x00000d03: expected 0x0000080N (IDX unsigned-byte "
        "images with N >= 1 dimensions)");
  CHECK(idx_error(idx_bytes(0x00000800, {}, {}), kLabels).starts_with("IMAGES: byte 0: bad magic"));
  CHECK(idx_error(kImages.substr(0, kImages.size() - 1), kLabels) ==
        "IMAGES: truncated: header says 12 bytes of data, file has 11");
  CHECK(idx_error(kImages + "x", kLabels) ==
        "IMAGES: byte 28: 1 unexpected bytes after the 12 bytes of data the header describes");
  CHECK(idx_error(kImages.substr(0, 10), kLabels) ==
        "IMAGES: truncated: the header needs 16 bytes, file has 10");
  CHECK(idx_error(kImages, std::string("\0\0", 2)) ==
        "LABELS: truncated: expected a 4-byte IDX magic number, file has 2 bytes");
  CHECK(idx_error(kImages, "") == "LABELS: empty file: expected an IDX header");
  CHECK(idx_error(idx_bytes(0x00000803, {3, 0, 2}, {}), kLabels) ==
        "IMAGES: byte 8: dimension 1 is 0: expected at least 1");
  CHECK(idx_error(idx_bytes(0x00000804, {0xffffffff, 0xffffffff, 0xffffffff, 2}, {}), kLabels) ==
        "IMAGES: byte 12: the dimensions multiply to more than 2^64 bytes");
  CHECK(idx_error(idx_bytes(0x00000803, {0, 2, 2}, {}), idx_bytes(0x00000801, {0}, {})) ==
        "IMAGES: no images: the header says 0");
  CHECK(idx_error(kImages, idx_bytes(0x00000801, {2}, {0, 1})) ==
        "IMAGES: 3 images, but LABELS has 2 labels: expected one label per image");
  CHECK(idx_error(kImages, idx_bytes(0x00000801, {3}, {0, 0, 0})) ==
        "LABELS: every label is 0: expected at least 2 classes");
}

TEST_CASE("load_idx: missing files") {
  TempDir dir;
  const auto labels = dir.write("labels", kLabels);
  const auto missing = dir.path() / "no-images";
  CHECK_THROWS_WITH_AS(load_idx(missing, labels),
                       (missing.string() + ": cannot open: No such file or directory").c_str(),
                       InputError);
}
