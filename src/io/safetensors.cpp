// The safetensors format (https://github.com/huggingface/safetensors):
//
//   u64 N (little-endian)  |  N bytes: a JSON object, space-padded  |  the data section
//
//   {"__metadata__": {"format": "pt", ...},
//    "layers.1.weight": {"dtype": "F32", "shape": [10, 64], "data_offsets": [0, 2560]}, ...}
//
// data_offsets are byte ranges of the data section; the reader requires, as the reference
// implementation does, that the tensors tile it with no gap or overlap. The writer writes F32
// or BF16 (an export's --dtype bf16); read_safetensors (lockstep's checkpoints) reads F32 only,
// SafetensorsReader (io/safetensors_reader.hpp: Hugging Face's weights) F32, BF16 and F16, one
// tensor at a time.
//
// Note [Whole-file checksum]
// "lockstep.checksum" is FNV-1a 64 of the data section only: a checkpoint's state file names it
// to pair the two files. It does not cover the header, so an edit of the metadata (n_head in
// lockstep.model) or of a shape would load, and `export` would re-sign it. So the writer adds
// "lockstep.file_checksum": FNV-1a 64 of every byte of the file as written, with that value's
// own 16 hex digits read as '0's. The reader checks it when present: an edit anywhere is
// refused. Files written before it carry no such key and are still read (their header is
// parsed strictly, their data checked against lockstep.checksum); a checkpoint whose state file
// is of version 2 must have it (checkpoint.cpp), so deleting the key does not pass an edit.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>

#include "common/bf16.hpp"
#include "common/fnv1a.hpp"
#include "io/durable_file.hpp"
#include "io/json.hpp"
#include "io/safetensors_reader.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/version.hpp"

namespace lockstep {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian and are copied to and from memory as is");

// The reference implementation's limit; it keeps a corrupt size field from allocating much.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kChecksumKey = "lockstep.checksum";
constexpr std::string_view kFileChecksumKey = "lockstep.file_checksum";
constexpr std::string_view kUnsigned = "0000000000000000";  // the value while it is computed

std::string checksum_hex(std::uint64_t checksum) { return fmt::format("{:016x}", checksum); }

std::uint64_t checksum_of(std::span<const std::byte> data) {
  return detail::fnv1a64(data.data(), data.size_bytes());
}

// Note [Whole-file checksum]: `header` holds kUnsigned where the value goes.
std::uint64_t file_checksum_of(std::string_view header, std::span<const std::byte> data) {
  const std::uint64_t header_size = header.size();
  std::uint64_t h = detail::fnv1a64(&header_size, sizeof header_size);
  h = detail::fnv1a64(header.data(), header.size(), h);
  return detail::fnv1a64(data.data(), data.size_bytes(), h);
}

std::string shape_text(std::span<const std::int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- reading --------------------------------------------------------------------------------

using detail::StoredTensor;

// The bytes of an element of each dtype the format defines.
std::uint64_t element_bytes(std::string_view dtype) {
  static constexpr std::pair<std::string_view, std::uint64_t> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, bytes] : kSizes)
    if (name == dtype) return bytes;
  return 0;
}

class HeaderReader {
 public:
  explicit HeaderReader(const std::filesystem::path& file) : file_(file) {}

  [[noreturn]] void fail(std::string_view what) const { detail::fail_input(file_, what); }
  [[noreturn]] void fail_at(const detail::JsonValue& v, std::string_view what) const {
    // Header offsets count from the start of the JSON, which follows the 8-byte size.
    detail::fail_input(file_, fmt::format("offset {}: {}", 8 + v.offset, what));
  }

  std::uint64_t unsigned_integer(const detail::JsonValue& v, std::string_view what) const {
    std::uint64_t n = 0;
    const std::string& t = v.text;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
    if (v.kind != detail::JsonValue::Kind::number || ec != std::errc{} ||
        end != t.data() + t.size())
      fail_at(v, fmt::format("{}: expected an integer in [0, 2^64), got {} {}", what,
                             v.kind_name(), v.text));
    return n;
  }

  std::map<std::string, std::string> metadata(const detail::JsonValue& v) const {
    if (v.kind != detail::JsonValue::Kind::object)
      fail_at(v, fmt::format("{}: expected an object of strings, got {}", kMetadataKey,
                             v.kind_name()));
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : v.members) {
      if (value.kind != detail::JsonValue::Kind::string)
        fail_at(value, fmt::format("{}: \"{}\": expected a string, got {}", kMetadataKey, key,
                                   value.kind_name()));
      out.emplace(key, value.text);
    }
    return out;
  }

  // `f32_only`: lockstep's checkpoints, F32 alone; else any dtype of a known size.
  StoredTensor tensor(const std::string& name, const detail::JsonValue& v, bool f32_only) const {
    const std::string where = fmt::format("tensor '{}'", name);
    if (v.kind != detail::JsonValue::Kind::object)
      fail_at(v, fmt::format("{}: expected an object with dtype, shape and data_offsets, got {}",
                             where, v.kind_name()));
    const detail::JsonValue *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [key, value] : v.members) {
      if (key == "dtype") dtype = &value;
      else if (key == "shape") shape = &value;
      else if (key == "data_offsets") offsets = &value;
      else fail_at(value, fmt::format("{}: unknown key \"{}\"; expected dtype, shape and "
                                      "data_offsets", where, key));
    }
    if (!dtype || !shape || !offsets)
      fail_at(v, fmt::format("{}: expected the keys dtype, shape and data_offsets", where));
    if (f32_only && (dtype->kind != detail::JsonValue::Kind::string || dtype->text != "F32"))
      fail_at(*dtype, fmt::format("{}: dtype: expected \"F32\", got {} {}", where,
                                  dtype->kind_name(), dtype->text));
    const std::uint64_t size =
        dtype->kind == detail::JsonValue::Kind::string ? element_bytes(dtype->text) : 0;
    if (size == 0)
      fail_at(*dtype, fmt::format("{}: dtype: expected one of safetensors' dtypes (F32, BF16, "
                                  "F16, I64, ...), got {} {}", where, dtype->kind_name(),
                                  dtype->text));
    if (shape->kind != detail::JsonValue::Kind::array)
      fail_at(*shape, fmt::format("{}: shape: expected an array of integers, got {}", where,
                                  shape->kind_name()));
    if (offsets->kind != detail::JsonValue::Kind::array || offsets->items.size() != 2)
      fail_at(*offsets, fmt::format("{}: data_offsets: expected [begin, end]", where));

    StoredTensor t{.name = name, .dtype = dtype->text, .shape = {}};
    constexpr auto kMaxDim = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    for (const detail::JsonValue& d : shape->items) {
      const std::uint64_t dim = unsigned_integer(d, where + ": shape");
      if (dim > kMaxDim)
        fail_at(d, fmt::format("{}: shape: dimension {} is too large", where, dim));
      t.shape.push_back(static_cast<std::int64_t>(dim));
    }
    t.begin = unsigned_integer(offsets->items[0], where + ": data_offsets[0]");
    t.end = unsigned_integer(offsets->items[1], where + ": data_offsets[1]");
    if (t.begin > t.end)
      fail_at(*offsets, fmt::format("{}: data_offsets [{}, {}]: expected begin <= end", where,
                                    t.begin, t.end));

    // Any zero dimension makes the tensor empty, whatever the others; else guard the product.
    std::uint64_t bytes = size;
    const bool empty = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
    for (const std::int64_t dim : t.shape) {
      if (empty) break;
      if (bytes > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(dim))
        fail_at(*shape, fmt::format("{}: shape {} is too large", where, shape_text(t.shape)));
      bytes *= static_cast<std::uint64_t>(dim);
    }
    if (empty) bytes = 0;
    if (t.end - t.begin != bytes)
      fail_at(*offsets, fmt::format("{}: data_offsets [{}, {}] span {} bytes, but {} of shape "
                                    "{} takes {}", where, t.begin, t.end, t.end - t.begin,
                                    t.dtype, shape_text(t.shape), bytes));
    return t;
  }

 private:
  const std::filesystem::path& file_;
};

// Continues each of `hashes` (FNV-1a 64) over the data section.
using HashData = std::function<void(std::span<std::uint64_t> hashes)>;

// Note [Whole-file checksum]: the file's checksum when present, then the data's.
void check_checksums(const HeaderReader& reader, const detail::JsonValue& root,
                     std::string header, const std::map<std::string, std::string>& metadata,
                     const HashData& hash_data) {
  const std::uint64_t data_start = 8 + header.size();
  const auto found = std::find_if(root.members.begin(), root.members.end(),
                                  [](const auto& m) { return m.first == kMetadataKey; });
  const detail::JsonValue* signature = nullptr;
  if (found != root.members.end())
    for (const auto& [key, value] : found->second.members)
      if (key == kFileChecksumKey) signature = &value;
  const auto recorded = metadata.find(std::string(kChecksumKey));
  if (!signature && recorded == metadata.end()) return;
  // hashes[0]: the whole file's, from its header on; hashes[1]: the data's.
  std::uint64_t hashes[2] = {0, detail::kFnv1a64Basis};
  if (signature) {
    // The value as written: a quote, 16 hex digits, a quote; the digits become '0's.
    const std::size_t at = signature->offset + 1;
    if (signature->text.size() != kUnsigned.size() ||
        header.compare(at, kUnsigned.size(), signature->text) != 0)
      reader.fail_at(*signature, fmt::format("{}: expected 16 hex digits, got \"{}\"",
                                             kFileChecksumKey, signature->text));
    header.replace(at, kUnsigned.size(), kUnsigned);
    hashes[0] = file_checksum_of(header, {});
  }
  hash_data(hashes);
  if (signature && signature->text != checksum_hex(hashes[0]))
    reader.fail(fmt::format("the file's checksum is {}, its {} says {} (the file was edited "
                            "or is corrupt)", checksum_hex(hashes[0]), kFileChecksumKey,
                            signature->text));
  if (recorded != metadata.end() && recorded->second != checksum_hex(hashes[1]))
    reader.fail(fmt::format("offset {}: the data's checksum is {}, the header's {} says {} "
                            "(the data is corrupt)", data_start, checksum_hex(hashes[1]),
                            kChecksumKey, recorded->second));
}

std::uint64_t read_le64(detail::InputFile& in, std::string_view what) {
  std::uint64_t v = 0;
  in.read(std::as_writable_bytes(std::span(&v, 1)), what);
  return v;
}

// Printable ASCII, tabs and line ends, and well-formed UTF-8 sequences (one cut off by the end of
// `bytes` included): what a text file starts with.
bool looks_like_text(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const auto u = static_cast<unsigned char>(bytes[i]);
    if (u < 0x80) {
      if (u < 0x20 && u != '\n' && u != '\r' && u != '\t') return false;
      ++i;
      continue;
    }
    const std::size_t length = u >= 0xC2 && u <= 0xDF ? 2 : u >= 0xE0 && u <= 0xEF ? 3
                               : u >= 0xF0 && u <= 0xF4 ? 4 : 0;
    if (length == 0) return false;  // a continuation byte first, or no UTF-8 lead byte
    for (std::size_t k = 1; k < length && i + k < bytes.size(); ++k)
      if ((static_cast<unsigned char>(bytes[i + k]) & 0xC0) != 0x80) return false;
    i += length;
  }
  return true;
}

// When the first 8 bytes are no header size a safetensors file could have and the file starts
// with text (a text file given to --init-from), the message says what the file is rather than a
// header of 2^60 bytes; otherwise it is `why`. `size_field` holds the 8 bytes already read.
std::string not_safetensors(detail::InputFile& in, std::uint64_t size_field, std::string why) {
  std::string start(8, '\0');
  std::memcpy(start.data(), &size_field, 8);  // the 8 bytes as read_le64 read them
  std::string more(static_cast<std::size_t>(std::min<std::uint64_t>(in.size() - 8, 40)), '\0');
  in.read(std::as_writable_bytes(std::span(more)), "the file's start");
  start += more;
  if (!looks_like_text(start)) return why;
  std::string shown;
  for (const char c : start.substr(0, start.find_first_of("\r\n")))
    shown += c == '"' ? std::string("\\\"") : std::string(1, c);
  return fmt::format("not a safetensors file: it starts with text (\"{}\"), where a safetensors "
                     "file starts with the 8-byte size of its JSON header", shown);
}

}  // namespace

// ---- writing --------------------------------------------------------------------------------

std::uint64_t write_safetensors(const std::filesystem::path& file,
                                std::span<const ParamTensor> tensors, std::span<const float> params,
                                const std::map<std::string, std::string>& metadata,
                                TensorDtype dtype) {
  // The data section is `params` itself, so the tensors, by offset, must tile it.
  std::vector<const ParamTensor*> order;
  for (const ParamTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const ParamTensor* a, const ParamTensor* b) { return a->offset < b->offset; });
  std::size_t next = 0;
  std::set<std::string_view> names;
  for (const ParamTensor* t : order) {
    if (t->name == kMetadataKey || !names.insert(t->name).second || t->offset != next ||
        std::any_of(t->shape.begin(), t->shape.end(), [](std::int64_t d) { return d < 0; }))
      throw std::invalid_argument(fmt::format(
          "write_safetensors: {}: tensor '{}' at offset {} with shape {}: the tensors must have "
          "unique names and tile the {} parameters (next offset {})",
          file.string(), t->name, t->offset, shape_text(t->shape), params.size(), next));
    next += t->numel();
  }
  if (next != params.size())
    throw std::invalid_argument(fmt::format(
        "write_safetensors: {}: the tensors cover {} of {} parameters", file.string(), next,
        params.size()));

  // The data section: `params` as is, or each value rounded to bf16 (Note [Rounding to bf16]).
  std::vector<std::uint16_t> bf16;
  if (dtype == TensorDtype::bf16)
    std::transform(params.begin(), params.end(), std::back_inserter(bf16), detail::float_to_bf16);
  const std::span<const std::byte> data =
      dtype == TensorDtype::bf16 ? std::as_bytes(std::span(bf16)) : std::as_bytes(params);
  const std::size_t element_bytes = dtype == TensorDtype::bf16 ? 2 : sizeof(float);
  const std::uint64_t checksum = checksum_of(data);
  std::map<std::string, std::string> meta = metadata;
  meta.insert_or_assign("format", "pt");
  meta.insert_or_assign("lockstep.version", kVersion);
  meta.insert_or_assign(std::string(kChecksumKey), checksum_hex(checksum));
  meta.insert_or_assign(std::string(kFileChecksumKey), std::string(kUnsigned));

  std::string header = fmt::format("{{{}:{{", detail::json_quote(kMetadataKey));
  std::size_t signature_at = 0;  // where the file checksum's digits go
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    header += fmt::format("{}{}:", it == meta.begin() ? "" : ",", detail::json_quote(it->first));
    if (it->first == kFileChecksumKey) signature_at = header.size() + 1;  // past the quote
    header += detail::json_quote(it->second);
  }
  header += "}";
  for (const ParamTensor* t : order) {
    const std::size_t begin = t->offset * element_bytes;
    header += fmt::format(",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          detail::json_quote(t->name), dtype == TensorDtype::bf16 ? "BF16" : "F32",
                          fmt::join(t->shape, ","), begin, begin + t->numel() * element_bytes);
  }
  header += "}";
  // Pad so that the data starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');
  header.replace(signature_at, kUnsigned.size(), checksum_hex(file_checksum_of(header, data)));

  const std::uint64_t header_size = header.size();
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(&header_size, 1)),
                                               std::as_bytes(std::span(header)),
                                               data};
  detail::write_file_atomically(file, pieces);
  return checksum;
}

// ---- reading --------------------------------------------------------------------------------

namespace {

// A file's header, read and checked: its tensors tile the data section.
struct Header {
  std::string text;
  detail::JsonValue root;
  std::uint64_t data_start = 0;
  std::vector<StoredTensor> tensors;  // by offset
  std::map<std::string, std::string> metadata;
};

Header read_header(detail::InputFile& in, const HeaderReader& reader, bool f32_only) {
  if (in.size() < 8)
    reader.fail(fmt::format("offset 0: expected an 8-byte header size, the file has {} bytes",
                            in.size()));
  const std::uint64_t header_size = read_le64(in, "header size");
  if (header_size > kMaxHeaderBytes)
    reader.fail(not_safetensors(in, header_size,
                                fmt::format("offset 0: header size {} exceeds the limit of {} "
                                            "bytes", header_size, kMaxHeaderBytes)));
  if (header_size > in.size() - 8)
    reader.fail(not_safetensors(in, header_size,
                                fmt::format("offset 0: header size {} runs past the end of the "
                                            "file ({} bytes after the size)", header_size,
                                            in.size() - 8)));
  Header out;
  out.text.assign(header_size, '\0');
  out.data_start = 8 + header_size;
  in.read(std::as_writable_bytes(std::span(out.text)), "JSON header");

  try {
    out.root = detail::parse_json(out.text);
  } catch (const detail::JsonError& e) {
    reader.fail(fmt::format("offset {}: bad JSON header: {}", 8 + e.offset(), e.what()));
  }
  if (out.root.kind != detail::JsonValue::Kind::object)
    reader.fail_at(out.root, fmt::format("expected a JSON object as the header, got {}",
                                         out.root.kind_name()));
  for (const auto& [key, value] : out.root.members) {
    if (key == kMetadataKey) out.metadata = reader.metadata(value);
    else out.tensors.push_back(reader.tensor(key, value, f32_only));
  }

  const std::uint64_t data_size = in.size() - out.data_start;
  std::sort(out.tensors.begin(), out.tensors.end(), [](const StoredTensor& a, const StoredTensor& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  std::uint64_t covered = 0;
  for (const StoredTensor& t : out.tensors) {
    if (t.begin != covered)
      reader.fail(fmt::format(
          "tensor '{}': data_offsets [{}, {}]: expected it to begin at {}, where the previous "
          "tensor ends (tensors must not overlap or leave gaps)", t.name, t.begin, t.end, covered));
    covered = t.end;
  }
  if (covered != data_size)
    reader.fail(fmt::format("offset {}: the tensors cover {} bytes of data, the file holds {} "
                            "(truncated or extended?)", out.data_start, covered, data_size));
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::filesystem::path& file) {
  detail::InputFile in(file);
  const HeaderReader reader(file);
  Header header = read_header(in, reader, /*f32_only=*/true);
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  out.data.resize((in.size() - header.data_start) / sizeof(float));
  in.read(std::as_writable_bytes(std::span(out.data)), "tensor data");
  for (StoredTensor& t : header.tensors)
    out.tensors.push_back({.name = std::move(t.name),
                           .offset = static_cast<std::size_t>(t.begin / sizeof(float)),
                           .shape = std::move(t.shape)});
  const std::span<const std::byte> data = std::as_bytes(std::span(out.data));
  check_checksums(reader, header.root, std::move(header.text), out.metadata,
                  [&](std::span<std::uint64_t> hashes) {
                    for (std::uint64_t& h : hashes) h = detail::fnv1a64(data.data(), data.size(), h);
                  });
  return out;
}

// ---- reading one tensor at a time -----------------------------------------------------------

namespace detail {

std::size_t StoredTensor::numel() const {
  std::size_t n = 1;
  for (const std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return float_of_bits(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return float_of_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in a float.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

SafetensorsReader::SafetensorsReader(std::filesystem::path file) : in_(std::move(file)) {
  const HeaderReader reader(in_.path());
  Header header = read_header(in_, reader, /*f32_only=*/false);
  data_start_ = header.data_start;
  tensors_ = std::move(header.tensors);
  metadata_ = std::move(header.metadata);
  check_checksums(reader, header.root, std::move(header.text), metadata_,
                  [&](std::span<std::uint64_t> hashes) {
                    std::vector<std::byte> piece(std::size_t{1} << 20);
                    for (std::uint64_t left = in_.size() - data_start_; left > 0;) {
                      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, piece.size()));
                      in_.read(std::span(piece).first(n), "tensor data");
                      for (std::uint64_t& h : hashes) h = fnv1a64(piece.data(), n, h);
                      left -= n;
                    }
                  });
}

const StoredTensor* SafetensorsReader::find(std::string_view name) const {
  for (const StoredTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void SafetensorsReader::read(const StoredTensor& t, std::span<float> out) {
  if (out.size() != t.numel())
    throw std::invalid_argument(fmt::format("SafetensorsReader::read: tensor '{}' has {} values, "
                                            "the buffer {}", t.name, t.numel(), out.size()));
  in_.seek(data_start_ + t.begin);
  const std::string what = fmt::format("tensor '{}'", t.name);
  if (t.dtype == "F32") return in_.read(std::as_writable_bytes(out), what);
  if (t.dtype != "BF16" && t.dtype != "F16")
    fail_input(in_.path(), fmt::format("tensor '{}': dtype {}: expected F32, BF16 or F16 (the "
                                       "floating-point dtypes lockstep widens to fp32)",
                                       t.name, t.dtype));
  // Widened in pieces through a small buffer of 16-bit values.
  std::vector<std::uint16_t> piece(std::min<std::size_t>(out.size(), std::size_t{1} << 19));
  for (std::size_t done = 0; done < out.size();) {
    const std::size_t n = std::min(piece.size(), out.size() - done);
    in_.read(std::as_writable_bytes(std::span(piece).first(n)), what);
    if (t.dtype == "BF16")
      std::transform(piece.begin(), piece.begin() + static_cast<std::ptrdiff_t>(n),
                     out.begin() + static_cast<std::ptrdiff_t>(done), bf16_to_float);
    else
      std::transform(piece.begin(), piece.begin() + static_cast<std::ptrdiff_t>(n),
                     out.begin() + static_cast<std::ptrdiff_t>(done), f16_to_float);
    done += n;
  }
}

}  // namespace detail

}  // namespace lockstep
