#include "io/state_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/fnv1a.hpp"
#include "io/durable_file.hpp"

namespace lockstep::detail {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian and are copied to and from memory as is");

constexpr std::string_view kMagic = "LSTPSTATE";
constexpr std::uint32_t kVersion = 4;
constexpr std::uint32_t kPayloadChecksumVersion = 1;  // its checksum covers the payload only
constexpr std::uint32_t kConfigValuesVersion = 3;     // the first to list the config's keys
constexpr std::uint32_t kEpochStartVersion = 4;       // the first to hold epoch_start
constexpr std::size_t kChecksumAt = 21;
constexpr std::uint64_t kHeaderBytes = kMagic.size() + 4 + 8 + 8;
constexpr OptimizerKind kOptimizers[] = {OptimizerKind::sgd, OptimizerKind::adamw};

template <class T>
void put(std::string& out, T value) {
  char bytes[sizeof value];
  std::memcpy(bytes, &value, sizeof value);
  out.append(bytes, sizeof value);
}

// check_state() has made sure that the length fits.
template <class Length>
void put_string(std::string& out, std::string_view s) {
  put(out, static_cast<Length>(s.size()));
  out += s;
}

// Reads the payload field by field; every error names the field and its offset in the file.
class PayloadReader {
 public:
  PayloadReader(const std::filesystem::path& file, std::string_view payload)
      : file_(file), payload_(payload) {}

  std::uint64_t offset() const { return kHeaderBytes + pos_; }
  std::size_t remaining() const { return payload_.size() - pos_; }

  [[noreturn]] void fail_at(std::uint64_t offset, std::string_view what) const {
    fail_input(file_, fmt::format("offset {}: {}", offset, what));
  }

  std::string_view bytes(std::size_t n, std::string_view field) {
    if (remaining() < n)
      fail_at(offset(), fmt::format("expected {} bytes of {}, the file ends at {}", n, field,
                                    kHeaderBytes + payload_.size()));
    const std::string_view out = payload_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  template <class T>
  T get(std::string_view field) {
    T value;
    std::memcpy(&value, bytes(sizeof value, field).data(), sizeof value);
    return value;
  }

  // A signed field that must not be below `min`.
  template <class T>
  T at_least(T min, std::string_view field) {
    const std::uint64_t at = offset();
    const T value = get<T>(field);
    if (value < min) fail_at(at, fmt::format("{}: expected >= {}, got {}", field, min, value));
    return value;
  }

  template <class Length>
  std::string_view string(std::string_view field) {
    const auto length = get<Length>(field);
    return bytes(length, field);
  }

 private:
  const std::filesystem::path& file_;
  std::string_view payload_;
  std::size_t pos_ = 0;
};

OptimizerKind read_optimizer(PayloadReader& in) {
  const std::uint64_t at = in.offset();
  const std::string_view name = in.string<std::uint8_t>("optimizer name");
  for (const OptimizerKind kind : kOptimizers)
    if (to_string(kind) == name) return kind;
  in.fail_at(at, fmt::format("optimizer: expected sgd or adamw, got '{}'",
                             std::string(name.substr(0, 32))));
}

}  // namespace

void check_state(const TrainState& s, std::span<const StateVector> optimizer_state) {
  if (s.step < 0 || s.samples < 0 || s.optimizer_steps < 0 || s.workers < 1)
    throw std::invalid_argument(fmt::format(
        "checkpoint state: expected step, samples and optimizer_steps >= 0 and workers >= 1, "
        "got {}, {}, {} and {}", s.step, s.samples, s.optimizer_steps, s.workers));
  if (std::find(std::begin(kOptimizers), std::end(kOptimizers), s.optimizer) ==
      std::end(kOptimizers))
    throw std::invalid_argument(fmt::format("checkpoint state: unknown optimizer kind {}",
                                            static_cast<int>(s.optimizer)));
  for (const auto& [key, value] : s.config)
    if (key.empty() || key.size() > std::numeric_limits<std::uint16_t>::max() ||
        value.size() > std::numeric_limits<std::uint32_t>::max())
      throw std::invalid_argument(fmt::format(
          "checkpoint state: config key '{}': expected 1 to 65535 bytes of key and at most "
          "2^32 - 1 of value", key.substr(0, 64)));
  for (std::size_t i = 0; i < optimizer_state.size(); ++i) {
    const std::string& name = optimizer_state[i].name;
    const bool repeated = std::any_of(optimizer_state.begin(), optimizer_state.begin() + i,
                                      [&](const StateVector& v) { return v.name == name; });
    if (name.empty() || repeated || name.size() > std::numeric_limits<std::uint16_t>::max())
      throw std::invalid_argument(fmt::format(
          "checkpoint state: state vector {}: expected a new name of 1 to 65535 bytes, got '{}'",
          i, name));
  }
}

void write_state_file(const std::filesystem::path& file, const TrainState& s,
                      std::span<const StateVector> optimizer_state,
                      std::uint64_t weights_checksum) {
  check_state(s, optimizer_state);
  std::string fields;
  put(fields, s.step);
  put(fields, s.epoch);
  put(fields, s.batch_in_epoch);
  put(fields, s.epoch_start);
  put(fields, s.samples);
  put(fields, s.config_hash);
  put(fields, s.workers);
  put_string<std::uint8_t>(fields, to_string(s.optimizer));
  put(fields, s.optimizer_steps);
  put(fields, s.seed);
  put(fields, weights_checksum);
  put(fields, static_cast<std::uint32_t>(s.config.size()));
  for (const auto& [key, value] : s.config) {
    put_string<std::uint16_t>(fields, key);
    put_string<std::uint32_t>(fields, value);
  }
  put(fields, static_cast<std::uint32_t>(optimizer_state.size()));

  // Each vector goes to disk from its own memory: its prefix here, its values in place.
  std::vector<std::string> prefixes(optimizer_state.size());
  std::vector<std::span<const std::byte>> pieces{{}, std::as_bytes(std::span(fields))};
  for (std::size_t i = 0; i < optimizer_state.size(); ++i) {
    const StateVector& v = optimizer_state[i];
    put_string<std::uint16_t>(prefixes[i], v.name);
    put(prefixes[i], static_cast<std::uint64_t>(v.values.size()));
    pieces.push_back(std::as_bytes(std::span(prefixes[i])));
    pieces.push_back(std::as_bytes(std::span(v.values)));
  }

  std::uint64_t payload_size = 0;
  for (std::size_t i = 1; i < pieces.size(); ++i) payload_size += pieces[i].size();
  std::string header(kMagic);
  put(header, kVersion);
  put(header, payload_size);
  std::uint64_t checksum = fnv1a64(header.data(), header.size());
  for (std::size_t i = 1; i < pieces.size(); ++i)
    checksum = fnv1a64(pieces[i].data(), pieces[i].size(), checksum);
  put(header, checksum);
  pieces[0] = std::as_bytes(std::span(header));
  write_file_atomically(file, pieces);
}

StateFile read_state_file(const std::filesystem::path& file) {
  InputFile in(file);
  std::string header(kHeaderBytes, '\0');
  const auto field = [&](std::size_t at, std::size_t size, std::string_view what) {
    in.read(std::as_writable_bytes(std::span(header)).subspan(at, size), what);
  };
  field(0, kMagic.size(), "magic");
  if (std::string_view(header).substr(0, kMagic.size()) != kMagic)
    fail_input(file, fmt::format("offset 0: expected the magic \"{}\": not a lockstep state file",
                                 kMagic));
  field(kMagic.size(), kHeaderBytes - kMagic.size(), "header");
  std::uint32_t version = 0;
  std::uint64_t payload_size = 0, checksum = 0;
  std::memcpy(&version, header.data() + 9, sizeof version);
  std::memcpy(&payload_size, header.data() + 13, sizeof payload_size);
  std::memcpy(&checksum, header.data() + kChecksumAt, sizeof checksum);
  if (version < kPayloadChecksumVersion || version > kVersion)
    fail_input(file, fmt::format("offset 9: expected version {} to {}, got {}",
                                 kPayloadChecksumVersion, kVersion, version));
  if (payload_size != in.size() - kHeaderBytes)
    fail_input(file, fmt::format("offset 13: the header announces {} payload bytes, the file "
                                 "holds {} after the header (truncated or extended?)",
                                 payload_size, in.size() - kHeaderBytes));

  std::string payload(payload_size, '\0');
  in.read(std::as_writable_bytes(std::span(payload)), "payload");
  const std::uint64_t actual = fnv1a64(
      payload.data(), payload.size(),
      version == kPayloadChecksumVersion ? kFnv1a64Basis : fnv1a64(header.data(), kChecksumAt));
  if (actual != checksum)
    fail_input(file, fmt::format("offset 21: the file's checksum is {:016x}, the header says "
                                 "{:016x} (the file is corrupt or was edited)", actual, checksum));

  PayloadReader r(file, payload);
  StateFile out;
  out.version = version;
  TrainState& s = out.state;
  s.step = r.at_least<std::int64_t>(0, "step");
  s.epoch = r.get<std::uint64_t>("epoch");
  s.batch_in_epoch = r.get<std::uint64_t>("batch_in_epoch");
  if (version >= kEpochStartVersion) s.epoch_start = r.get<std::uint64_t>("epoch_start");
  s.samples = r.at_least<std::int64_t>(0, "samples");
  s.config_hash = r.get<std::uint64_t>("config_hash");
  s.workers = r.at_least<std::int32_t>(1, "workers");
  s.optimizer = read_optimizer(r);
  s.optimizer_steps = r.at_least<std::int64_t>(0, "optimizer_steps");
  s.seed = r.get<std::uint64_t>("seed");
  out.weights_checksum = r.get<std::uint64_t>("weights_checksum");
  if (version >= kConfigValuesVersion) {
    const auto keys = r.get<std::uint32_t>("config key count");
    for (std::uint32_t i = 0; i < keys; ++i) {
      std::string key(r.string<std::uint16_t>("config key"));
      s.config.emplace_back(std::move(key), std::string(r.string<std::uint32_t>("config value")));
    }
  }

  const auto count = r.get<std::uint32_t>("state vector count");
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint64_t at = r.offset();
    const std::string name(r.string<std::uint16_t>("state vector name"));
    const bool duplicate = std::any_of(out.optimizer_state.begin(), out.optimizer_state.end(),
                                       [&](const StateVector& v) { return v.name == name; });
    if (name.empty() || duplicate)
      r.fail_at(at, fmt::format("state vector {}: expected a new, non-empty name, got '{}'", i,
                                name));
    const std::uint64_t values_at = r.offset();
    const auto n = r.get<std::uint64_t>("state vector length");
    // Checked before allocating, so a corrupt length cannot ask for terabytes.
    if (n > r.remaining() / sizeof(float))
      r.fail_at(values_at, fmt::format("state vector '{}': expected {} floats, the file has {} "
                                       "bytes left", name, n, r.remaining()));
    StateVector v{.name = name, .values = std::vector<float>(static_cast<std::size_t>(n))};
    const std::string_view raw = r.bytes(v.values.size() * sizeof(float), name);
    std::copy(raw.begin(), raw.end(), reinterpret_cast<char*>(v.values.data()));
    out.optimizer_state.push_back(std::move(v));
  }
  if (r.remaining() != 0)
    r.fail_at(r.offset(), fmt::format("expected the end of the file, found {} more bytes",
                                      r.remaining()));
  return out;
}

}  // namespace lockstep::detail
