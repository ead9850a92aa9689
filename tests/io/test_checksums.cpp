// Note [Whole-file checksum]: an edit anywhere in a safetensors or state file is refused, and
// --resume (load_latest) falls back to the previous checkpoint; files written before the
// whole-file checksums are still read.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint_fixtures.hpp"
#include "common/fnv1a.hpp"
#include "io/state_file.hpp"

namespace fs = std::filesystem;
using namespace lockstep;
using namespace lockstep::test;

namespace {

std::uint64_t header_size_of(const std::string& bytes) {
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// `bytes` with `from` in the safetensors header replaced by `to`, padded with spaces to the same
// length, so that the data section stays where it was.
std::string edit_header(std::string bytes, const std::string& from, const std::string& to) {
  REQUIRE(to.size() <= from.size());
  const std::size_t at = bytes.find(from, 8);
  REQUIRE(at != std::string::npos);
  REQUIRE(at < 8 + header_size_of(bytes));
  bytes.erase(at, from.size());
  bytes.insert(at, to);
  bytes.insert(8 + header_size_of(bytes) - (from.size() - to.size()),
               std::string(from.size() - to.size(), ' '));
  return bytes;
}

// The `"lockstep.file_checksum":"<16 digits>"` entry of a safetensors header, with its comma.
std::string signature_entry(const std::string& bytes) {
  const std::string key = ",\"lockstep.file_checksum\":\"";
  const std::size_t at = bytes.find(key);
  REQUIRE(at != std::string::npos);
  return bytes.substr(at, key.size() + 17);
}

}  // namespace

TEST_CASE("checkpoint: every flipped byte of the weights' header is refused") {
  TempDir tmp;
  CheckpointManager manager(tmp.path() / "ckpt", 0);
  const CheckpointFiles files = manager.save(make_checkpoint(small_model(), 5));
  const std::string bytes = slurp(files.weights);
  const std::uint64_t header_end = 8 + header_size_of(bytes);
  // A flip in the key "lockstep.file_checksum" removes the key: the state (version 2) refuses
  // that; anywhere else, the whole-file checksum does.
  for (std::size_t i = 0; i < header_end; ++i) {
    CAPTURE(i);
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x01);
    spit(files.weights, flipped);
    CHECK_THROWS_AS(CheckpointManager::load(files.weights), InputError);
  }
}

TEST_CASE("safetensors: a metadata edit is refused, naming the whole-file checksum") {
  TempDir dir;
  const Checkpoint c = make_checkpoint(small_model(), 5);
  const fs::path file = dir.path() / "w.safetensors";
  write_safetensors(file, c.tensors, c.params, {{"note", "hi"}});
  const std::string bytes = slurp(file);
  // A valid JSON edit of a value, as a person would make it.
  spit(file, edit_header(bytes, "\"note\":\"hi\"", "\"note\":\"ho\""));
  const std::string why = input_error_of([&] { read_safetensors(file); });
  CHECK(why.starts_with(file.string() + ": the file's checksum is "));
  CHECK(why.find("its lockstep.file_checksum says") != std::string::npos);
  CHECK(why.ends_with("(the file was edited or is corrupt)"));
}

TEST_CASE("checkpoint: an edited weights header falls back to the previous checkpoint") {
  TempDir tmp;
  const Model model = small_model();
  CheckpointManager manager(tmp.path() / "ckpt", 0);
  Checkpoint c10 = make_checkpoint(model, 10), c20 = make_checkpoint(model, 20);
  c10.metadata["lockstep.model"] = c20.metadata["lockstep.model"] = "gpt n_head=4";
  manager.save(c10);
  const CheckpointFiles newest = manager.save(c20);
  const std::string bytes = slurp(newest.weights);

  const auto latest_step = [&](std::vector<std::string>& warnings) {
    const auto loaded = manager.load_latest([&](const std::string& w) { warnings.push_back(w); });
    REQUIRE(loaded.has_value());
    return loaded->state.step;
  };
  // n_head 4 -> 2, the data and the data's checksum untouched.
  spit(newest.weights, edit_header(bytes, "n_head=4", "n_head=2"));
  std::vector<std::string> warnings;
  CHECK(latest_step(warnings) == 10);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("lockstep.file_checksum says") != std::string::npos);
  CHECK(warnings[0].ends_with("; using the previous checkpoint step_00000010"));
  CHECK_THROWS_AS(CheckpointManager::load(newest.weights), InputError);

  // The same edit with the whole-file checksum deleted: the version 2 state still refuses it.
  spit(newest.weights,
       edit_header(edit_header(bytes, "n_head=4", "n_head=2"), signature_entry(bytes), ""));
  warnings.clear();
  CHECK(latest_step(warnings) == 10);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("no lockstep.file_checksum in the metadata") != std::string::npos);
}

TEST_CASE("checkpoint: a pair written before whole-file checksums (state version 1) still loads") {
  TempDir tmp;
  const Model model = small_model();
  CheckpointManager manager(tmp.path() / "ckpt", 0);
  const Checkpoint c = make_checkpoint(model, 7);
  const CheckpointFiles files = manager.save(c);
  // The old writer: no lockstep.file_checksum; state version 1, its checksum over the payload.
  const std::string weights = slurp(files.weights);
  spit(files.weights, edit_header(weights, signature_entry(weights), ""));
  // Versions 1 and 2 have no config key count (0 here), after optimizer_steps, seed and
  // weights_checksum, and no epoch_start (after batch_in_epoch; 0 here) as versions up to 3.
  std::string state = slurp(files.state);
  state.erase(29 + 52 + 1 + 5 + 8 + 8 + 8, 4);
  state.erase(29 + 24, 8);
  const std::uint64_t payload = state.size() - 29;
  std::memcpy(state.data() + 13, &payload, 8);
  const std::uint32_t v1 = 1;
  std::memcpy(state.data() + 9, &v1, 4);
  const std::uint64_t sum = detail::fnv1a64(state.data() + 29, state.size() - 29);
  std::memcpy(state.data() + 21, &sum, 8);
  spit(files.state, state);

  CHECK(detail::read_state_file(files.state).version == 1);
  const Checkpoint loaded = CheckpointManager::load(files.weights);
  CHECK(loaded.state.step == 7);
  CHECK(same_bits(loaded.params, c.params));
  // A version 1 state is still checked against its checksum.
  std::memcpy(state.data() + 21, "\0\0\0\0\0\0\0\0", 8);
  spit(files.state, state);
  CHECK_THROWS_AS(detail::read_state_file(files.state), InputError);
}
