// The two checkpoint file formats: exact round trips, and readers that reject every truncated,
// corrupt or random input with an InputError naming the file (never a crash, never a huge
// allocation).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <random>

#include "checkpoint_fixtures.hpp"
#include "common/bf16.hpp"
#include "common/fnv1a.hpp"
#include "io/json.hpp"
#include "io/state_file.hpp"
#include "lockstep/version.hpp"

using namespace lockstep;
using namespace lockstep::test;
namespace fs = std::filesystem;

namespace {

// A .npy of the flat float32 buffer, for tests/io/check_safetensors.py.
void write_npy(const fs::path& file, const std::vector<float>& values) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
                                   values.size());
  header.append(63 - (10 + header.size()) % 64, ' ');  // the data starts 64-byte aligned
  header += '\n';
  const auto length = static_cast<std::uint16_t>(header.size());
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes.append(reinterpret_cast<const char*>(&length), 2);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  spit(file, bytes);
}

// Reads `bytes` as a safetensors file; true if it loaded, false if it was rejected with an
// InputError that names the file. Anything else fails the test.
bool loads(const TempDir& dir, std::string_view bytes) {
  const fs::path file = dir.write("fuzz.safetensors", bytes);
  try {
    read_safetensors(file);
    return true;
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).starts_with(file.string() + ": "));
    return false;
  }
}

bool loads_state(const TempDir& dir, std::string_view bytes) {
  const fs::path file = dir.write("fuzz.state", bytes);
  try {
    detail::read_state_file(file);
    return true;
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).starts_with(file.string() + ": "));
    return false;
  }
}

// A safetensors file made by hand: the given JSON header, then `data_bytes` zero bytes.
std::string safetensors_bytes(std::string_view header, std::size_t data_bytes) {
  const std::uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += header;
  out.append(data_bytes, '\0');
  return out;
}

}  // namespace

TEST_CASE("safetensors: round trip is bit-exact, in the parameter buffer's layout") {
  TempDir dir;
  const Model model = small_model();
  const Checkpoint c = make_checkpoint(model, 5);
  const fs::path file = dir.path() / "w.safetensors";
  const std::uint64_t checksum = write_safetensors(file, c.tensors, c.params, {{"note", "hi"}});

  const SafetensorsFile read = read_safetensors(file);
  CHECK(same_bits(read.data, c.params));
  REQUIRE(read.tensors.size() == 4);
  for (const ParamTensor& t : c.tensors) {
    CAPTURE(t.name);
    const auto it = std::find_if(read.tensors.begin(), read.tensors.end(),
                                 [&](const ParamTensor& r) { return r.name == t.name; });
    REQUIRE(it != read.tensors.end());
    CHECK(it->shape == t.shape);
    CHECK(it->offset == t.offset);
  }
  CHECK(read.tensors.front().name == "layers.2.weight");  // sorted by offset: the last layer first
  CHECK(read.metadata.at("format") == "pt");
  CHECK(read.metadata.at("lockstep.version") == kVersion);
  CHECK(read.metadata.at("lockstep.checksum") == fmt::format("{:016x}", checksum));
  CHECK(read.metadata.at("note") == "hi");

  const std::string bytes = slurp(file);
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  CHECK(header_size % 8 == 0);
  CHECK(bytes[8] == '{');
  CHECK(bytes.size() == 8 + header_size + c.params.size() * sizeof(float));
  const std::size_t data_start = 8 + header_size;
  CHECK(checksum == detail::fnv1a64(bytes.data() + data_start, bytes.size() - data_start));

  // For tests/io/check_safetensors.py: LOCKSTEP_KEEP_CHECKPOINT_DIR=dir keeps a copy.
  if (const char* keep = std::getenv("LOCKSTEP_KEEP_CHECKPOINT_DIR")) {
    fs::create_directories(keep);
    Checkpoint finite = make_checkpoint(model, 5);
    finite.params = model.initial_parameters(5);
    write_safetensors(fs::path(keep) / "small.safetensors", finite.tensors, finite.params);
    write_npy(fs::path(keep) / "small.npy", finite.params);
  }
}

TEST_CASE("safetensors: the writer refuses tensors that do not tile the parameters") {
  TempDir dir;
  const Model model = small_model();
  const Checkpoint c = make_checkpoint(model, 1);
  std::vector<ParamTensor> gap = c.tensors;
  gap.pop_back();
  CHECK_THROWS_AS(write_safetensors(dir.path() / "a.safetensors", gap, c.params),
                  std::invalid_argument);
  std::vector<ParamTensor> overlap = c.tensors;
  overlap[1].offset -= 1;
  CHECK_THROWS_AS(write_safetensors(dir.path() / "b.safetensors", overlap, c.params),
                  std::invalid_argument);
  std::vector<ParamTensor> twins = c.tensors;
  twins[1].name = twins[0].name;
  CHECK_THROWS_AS(write_safetensors(dir.path() / "c.safetensors", twins, c.params),
                  std::invalid_argument);
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("safetensors: each kind of bad file is named, with where and what was expected") {
  TempDir dir;
  const std::string t2 = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const struct {
    std::string bytes;
    std::string message;
  } cases[] = {
      {"abc", "offset 0: expected an 8-byte header size, the file has 3 bytes"},
      {std::string(8, '\xff'), "offset 0: header size 18446744073709551615 exceeds the limit"},
      {"hello, world\nsecond line\n", "not a safetensors file: it starts with text (\"hello, "
                                        "world\"), where a safetensors file starts with"},
      {safetensors_bytes("{}", 0).substr(0, 9), "offset 0: header size 2 runs past the end"},
      {safetensors_bytes("{\"t\":", 0), "offset 13: bad JSON header: expected a value"},
      {safetensors_bytes("[]", 0), "offset 8: expected a JSON object as the header, got an array"},
      {safetensors_bytes(R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4),
       "offset 22: tensor 't': dtype: expected \"F32\", got a string F16"},
      {safetensors_bytes(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "offset 37: tensor 't': shape: expected an integer in [0, 2^64), got a number -1"},
      {safetensors_bytes(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "offset 55: tensor 't': data_offsets [0, 8] span 8 bytes, but F32 of shape [3] takes 12"},
      {safetensors_bytes(R"({"t":{"dtype":"F32","shape":[65536,65536,65536,65536],)"
                         R"("data_offsets":[0,0]}})", 0),
       "offset 36: tensor 't': shape [65536, 65536, 65536, 65536] is too large"},
      {safetensors_bytes("{" + t2 + R"(,"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "tensor 'u': data_offsets [4, 8]: expected it to begin at 8"},
      {safetensors_bytes("{" + t2 + "}", 12),
       "offset 62: the tensors cover 8 bytes of data, the file holds 12 (truncated or extended?)"},
      {safetensors_bytes("{" + t2 + "}", 4),
       "offset 62: the tensors cover 8 bytes of data, the file holds 4"},
      {safetensors_bytes(R"({"__metadata__":{"lockstep.checksum":"0000000000000000"},)" + t2 + "}",
                         8),
       "offset 118: the data's checksum is a8c7f832281a39c5, the header's lockstep.checksum says "
       "0000000000000000 (the data is corrupt)"},
      {safetensors_bytes(R"({"__metadata__":{"a":1}})", 0),
       "offset 29: __metadata__: \"a\": expected a string, got a number"},
      {safetensors_bytes(R"({"t":{"dtype":"F32","shape":[],"data_offsets":[0,4],"x":0}})", 4),
       "offset 64: tensor 't': unknown key \"x\"; expected dtype, shape and data_offsets"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    const fs::path file = dir.write("bad.safetensors", c.bytes);
    CHECK_THROWS_WITH_AS(read_safetensors(file),
                         doctest::Contains((file.string() + ": " + c.message).c_str()), InputError);
  }
  // Padding after the JSON is allowed; a scalar has shape [].
  const fs::path ok = dir.write(
      "ok.safetensors",
      safetensors_bytes("{" + t2 + R"(,"s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})" +
                            "  ",
                        12));
  CHECK(read_safetensors(ok).data.size() == 3);
}

TEST_CASE("safetensors: every truncation and every flipped data byte is rejected") {
  TempDir dir;
  const Checkpoint c = make_checkpoint(small_model(), 2);
  const fs::path file = dir.path() / "w.safetensors";
  write_safetensors(file, c.tensors, c.params);
  const std::string bytes = slurp(file);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(loads(dir, std::string_view(bytes).substr(0, n)));
  }
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    CAPTURE(i);
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
    // A flip in the header may still leave a valid file (a metadata value); never a crash.
    const bool loaded = loads(dir, flipped);
    if (i >= 8 + header_size) CHECK_FALSE(loaded);
  }
}

TEST_CASE("safetensors: the reader survives random garbage and random header edits") {
  TempDir dir;
  std::mt19937_64 rng(7);
  const auto byte = [&] { return static_cast<char>(rng() & 0xff); };
  for (int i = 0; i < 100; ++i) {
    std::string junk(rng() % 64, '\0');
    for (char& ch : junk) ch = byte();
    loads(dir, junk);
    // A plausible size field, so the JSON parser sees the garbage.
    loads(dir, safetensors_bytes(junk, rng() % 16));
  }
  const Checkpoint c = make_checkpoint(small_model(), 3);
  write_safetensors(dir.path() / "w.safetensors", c.tensors, c.params);
  const std::string valid = slurp(dir.path() / "w.safetensors");
  const std::string_view json_chars = "{}[]\",:0123456789-.eE \\u";
  for (int i = 0; i < 500; ++i) {
    std::string edited = valid;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
      const std::size_t at = 8 + rng() % 200;
      edited[at] = rng() % 2 ? byte() : json_chars[rng() % json_chars.size()];
    }
    loads(dir, edited);
  }
  // Nesting a million levels deep must not overflow the stack.
  CHECK_FALSE(loads(dir, safetensors_bytes(std::string(1'000'000, '['), 0)));
}

TEST_CASE("json: strings, escapes and UTF-8") {
  using detail::parse_json;
  CHECK(parse_json(R"("a\"b\\\/\n\u00e9\ud83d\ude00")").text ==
        "a\"b\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(parse_json(detail::json_quote("q\"\x01\xc3\xa9")).text == "q\"\x01\xc3\xa9");
  CHECK_THROWS_AS(parse_json(R"("\ud83d")"), detail::JsonError);
  CHECK_THROWS_AS(parse_json("\"\xc0\xaf\""), detail::JsonError);  // overlong '/'
  CHECK_THROWS_AS(parse_json("\"\xed\xa0\x80\""), detail::JsonError);  // a surrogate
  CHECK_THROWS_AS(parse_json(R"({"a":1,"a":2})"), detail::JsonError);
  CHECK_THROWS_AS(parse_json("01"), detail::JsonError);
  CHECK_THROWS_AS(parse_json("1."), detail::JsonError);
  CHECK(parse_json(" [1.5e-3, -0, true, null] ").items.size() == 4);
  CHECK_THROWS_AS(detail::json_quote("\xff"), std::invalid_argument);
}

TEST_CASE("state file: round trip, and every truncation and every flipped byte is rejected") {
  TempDir dir;
  const Checkpoint c = make_checkpoint(small_model(), 42);
  const fs::path file = dir.path() / "s.state";
  detail::write_state_file(file, c.state, c.optimizer_state, 0x0123456789abcdefull);

  const detail::StateFile read = detail::read_state_file(file);
  CHECK(read.state.step == 42);
  CHECK(read.state.epoch == 3);
  CHECK(read.state.batch_in_epoch == 7);
  CHECK(read.state.samples == 42 * 64);
  CHECK(read.state.config_hash == 0xfeedfacecafebeefull);
  CHECK(read.state.workers == 2);
  CHECK(read.state.optimizer == OptimizerKind::adamw);
  CHECK(read.state.optimizer_steps == 42);
  CHECK(read.state.seed == 9);
  CHECK(read.weights_checksum == 0x0123456789abcdefull);
  REQUIRE(read.optimizer_state.size() == 2);
  CHECK(read.optimizer_state[1].name == "adamw.v");
  CHECK(same_bits(read.optimizer_state[0].values, c.optimizer_state[0].values));
  CHECK(same_bits(read.optimizer_state[1].values, c.optimizer_state[1].values));

  const std::string bytes = slurp(file);
  CHECK(bytes.starts_with("LSTPSTATE"));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(loads_state(dir, std::string_view(bytes).substr(0, n)));
  }
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    CAPTURE(i);
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x01);
    CHECK_FALSE(loads_state(dir, flipped));
  }
  CHECK_THROWS_WITH_AS(detail::read_state_file(dir.write("x.state", "LSTPSTATX")),
                       doctest::Contains("offset 0: expected the magic \"LSTPSTATE\""), InputError);
}

// `file`'s bytes with the header's version and payload size set and its checksum recomputed
// over the rest, as that version's writer would have made them.
std::string as_version(std::string bytes, std::uint32_t version) {
  const std::uint64_t payload = bytes.size() - 29;
  std::memcpy(bytes.data() + 9, &version, 4);
  std::memcpy(bytes.data() + 13, &payload, 8);
  const std::uint64_t sum =
      detail::fnv1a64(bytes.data() + 29, payload, detail::fnv1a64(bytes.data(), 21));
  std::memcpy(bytes.data() + 21, &sum, 8);
  return bytes;
}

TEST_CASE("state file: the config's keys and epoch_start round trip, and versions 3 (no "
          "epoch_start) and 2 (the config's hash alone) still read") {
  TempDir dir;
  Checkpoint c = make_checkpoint(small_model(), 42);
  c.state.config = {{"optimizer.lr", "0.05"}, {"data.path", "/a b/c.txt"}, {"model.hidden", "[]"}};
  c.state.epoch_start = 123;
  const fs::path file = dir.path() / "s.state";
  detail::write_state_file(file, c.state, c.optimizer_state, 7);
  const detail::StateFile read = detail::read_state_file(file);
  CHECK(read.version == 4);
  CHECK(read.state.config == c.state.config);
  CHECK(read.state.epoch_start == 123);
  CHECK(read.state.batch_in_epoch == c.state.batch_in_epoch);
  CHECK(read.state.samples == c.state.samples);

  // The same state as version 3 wrote it: no epoch_start (after batch_in_epoch), read as 0.
  constexpr std::size_t kEpochStartAt = 29 + 24;
  std::string v3 = slurp(file);
  v3.erase(kEpochStartAt, 8);
  const detail::StateFile three = detail::read_state_file(dir.write("v3.state", as_version(v3, 3)));
  CHECK(three.version == 3);
  CHECK(three.state.epoch_start == 0);
  CHECK(three.state.config == c.state.config);
  CHECK(three.state.samples == c.state.samples);

  // As version 2 wrote it: no config key count either.
  c.state.config.clear();
  detail::write_state_file(file, c.state, c.optimizer_state, 7);
  std::string v2 = slurp(file);
  v2.erase(kEpochStartAt, 8);
  constexpr std::size_t kKeyCountAt = 29 + 44 + 1 + 5 + 8 + 8 + 8;
  v2.erase(kKeyCountAt, 4);
  const detail::StateFile old = detail::read_state_file(dir.write("v2.state", as_version(v2, 2)));
  CHECK(old.version == 2);
  CHECK(old.state.config.empty());
  CHECK(old.state.epoch_start == 0);
  CHECK(old.state.config_hash == c.state.config_hash);
  CHECK(same_bits(old.optimizer_state[1].values, c.optimizer_state[1].values));

  c.state.config = {{"", "x"}};
  CHECK_THROWS_AS(detail::write_state_file(file, c.state, c.optimizer_state, 7),
                  std::invalid_argument);
}

TEST_CASE("state file: a payload with a valid checksum but bad fields is rejected") {
  TempDir dir;
  const Checkpoint c = make_checkpoint(small_model(), 1);
  const fs::path file = dir.path() / "s.state";
  detail::write_state_file(file, c.state, c.optimizer_state, 1);
  const std::string valid = slurp(file);
  constexpr std::size_t kHeader = 29;

  // Rewrites the payload from `at` with `patch` and recomputes the checksum (version 2 and later:
  // of the header's first 21 bytes, then of the payload).
  const auto patched = [&](std::size_t at, std::string_view patch) {
    std::string out = valid;
    out.replace(kHeader + at, patch.size(), patch);
    const std::uint64_t sum = detail::fnv1a64(out.data() + kHeader, out.size() - kHeader,
                                              detail::fnv1a64(out.data(), 21));
    std::memcpy(out.data() + 21, &sum, 8);
    return out;
  };
  const auto le = [](auto v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); };
  const auto error = [&](const std::string& bytes) {
    return input_error_of([&] { detail::read_state_file(dir.write("p.state", bytes)); });
  };
  CHECK(error(patched(0, le(std::int64_t{-5}))).find("offset 29: step: expected >= 0, got -5") !=
        std::string::npos);
  // step, epoch, batch_in_epoch, epoch_start, samples, config_hash (8 bytes each), workers.
  CHECK(error(patched(48, le(std::int32_t{0}))).find("workers: expected >= 1, got 0") !=
        std::string::npos);
  CHECK(error(patched(52, "\x05" "adamx")).find("optimizer: expected sgd or adamw, got 'adamx'") !=
        std::string::npos);
  // The first vector's length, after its 2-byte name length and 7-byte name: 2^60 floats. Before
  // it: optimizer_steps, seed, weights_checksum, the config key count (0) and the vector count.
  const std::size_t first_vector = 52 + 1 + 5 + 8 + 8 + 8 + 4 + 4;
  CHECK(error(patched(first_vector + 2 + 7, le(std::uint64_t{1} << 60)))
            .find("state vector 'adamw.m': expected 1152921504606846976 floats") !=
        std::string::npos);

  std::mt19937_64 rng(11);
  for (int i = 0; i < 600; ++i) {
    std::string patch(1 + rng() % 8, '\0');
    for (char& ch : patch) ch = static_cast<char>(rng() % 4 == 0 ? 0xff : rng() & 0xff);
    const std::size_t at = rng() % (valid.size() - kHeader - patch.size());
    loads_state(dir, patched(at, patch));
  }
}

TEST_CASE("export --dtype bf16: BF16 tensors, each float_to_bf16 of the fp32 weight, half the bytes") {
  TempDir dir;
  Checkpoint c = make_checkpoint(small_model(), 5);  // a NaN with a payload, -0, a subnormal, inf
  // Ties: 1 + 2^-8 rounds down to the even 1.0, 1 + 3*2^-8 up to the even 1 + 2^-6.
  c.params[4] = std::bit_cast<float>(0x3F808000u);
  c.params[5] = std::bit_cast<float>(0x3F818000u);
  const fs::path f32 = dir.path() / "w32.safetensors", b16 = dir.path() / "w16.safetensors";
  export_torch(c, f32);
  export_torch(c, b16, TensorDtype::bf16);

  const auto split = [](const std::string& bytes) {
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    return std::pair{detail::parse_json(bytes.substr(8, n)), bytes.substr(8 + n)};
  };
  const auto [header32, data32] = split(slurp(f32));
  const auto [header16, data16] = split(slurp(b16));
  REQUIRE(data32.size() == c.params.size() * 4);
  REQUIRE(data16.size() == c.params.size() * 2);
  std::vector<std::uint16_t> bf16(c.params.size());
  std::memcpy(bf16.data(), data16.data(), data16.size());
  for (std::size_t i = 0; i < c.params.size(); ++i) {
    CAPTURE(i);
    CHECK(bf16[i] == detail::float_to_bf16(c.params[i]));
  }
  CHECK(bf16[0] == 0x7FC0);  // NaN: the quiet NaN, payload dropped
  CHECK(bf16[1] == 0x8000);  // -0
  CHECK(bf16[2] == 0x0000);  // the smallest subnormal rounds to +0
  CHECK(bf16[3] == 0x7F80);  // inf
  CHECK(bf16[4] == 0x3F80);
  CHECK(bf16[5] == 0x3F82);

  // Every tensor: dtype BF16, the same shape, data offsets half the F32 file's.
  REQUIRE(header16.members.size() == header32.members.size());
  std::size_t tensors = 0;
  for (std::size_t i = 0; i < header16.members.size(); ++i) {
    const auto& [name, t16] = header16.members[i];
    const auto& [name32, t32] = header32.members[i];
    REQUIRE(name == name32);
    if (name == "__metadata__") continue;
    CAPTURE(name);
    ++tensors;
    REQUIRE(t16.members.size() == 3);
    CHECK(t16.members[0].first == "dtype");
    CHECK(t16.members[0].second.text == "BF16");
    CHECK(t32.members[0].second.text == "F32");
    CHECK(t16.members[1].second.items.size() == t32.members[1].second.items.size());
    for (std::size_t k = 0; k < 2; ++k)
      CHECK(std::stoull(t16.members[2].second.items[k].text) * 2 ==
            std::stoull(t32.members[2].second.items[k].text));
  }
  CHECK(tensors == c.tensors.size());
  // read_safetensors (checkpoints) reads only F32: a BF16 file is refused, by name (load_weights
  // widens one: tests/io/test_hf_weights.cpp).
  CHECK_THROWS_WITH_AS(read_safetensors(b16), doctest::Contains("dtype: expected \"F32\", got a string BF16"),
                       InputError);
}

TEST_CASE("export --format hf: config.json names the dtype of the weights (torch_dtype)") {
  TempDir dir;
  const Checkpoint c = lockstep::test::gpt_checkpoint(
      {.vocab_size = 30, .context = 8, .n_layer = 1, .n_head = 2, .d_model = 8}, 3);
  for (const auto& [dtype, name] : {std::pair{TensorDtype::f32, "float32"},
                                    std::pair{TensorDtype::bf16, "bfloat16"}}) {
    CAPTURE(name);
    const fs::path out = dir.path() / name;
    export_hf(c, out, dtype);
    const detail::JsonValue config = detail::parse_json(slurp(out / "config.json"));
    const auto it = std::find_if(config.members.begin(), config.members.end(),
                                 [](const auto& m) { return m.first == "torch_dtype"; });
    REQUIRE(it != config.members.end());
    CHECK(it->second.text == name);
  }
}

// The message names the format, not the CLI's flag: Python's export(format="hf") reads it too.
TEST_CASE("export --format hf: a checkpoint of another model is bad input, named") {
  TempDir dir;
  Checkpoint c;
  c.weights_file = dir.path() / "mlp.safetensors";
  c.metadata["lockstep.model"] = "mlp 4-8-3";
  CHECK_THROWS_WITH_AS(export_hf(c, dir.path() / "out", TensorDtype::f32),
                       doctest::Contains("not a GPT checkpoint (lockstep.model: mlp 4-8-3); the "
                                         "Hugging Face format (hf) needs model.type gpt"),
                       InputError);
}
