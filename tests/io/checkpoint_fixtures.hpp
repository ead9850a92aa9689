// Shared by the checkpoint tests: a small model, a checkpoint of it, and file helpers.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>

#include "../data/temp_files.hpp"
#include "io/open_input.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"

namespace lockstep::test {

// 3 -> 4 -> 2: layers.0 (4x3 + 4) and layers.2 (2x4 + 2), 26 parameters, layers.2 first.
inline Model small_model() {
  return Model::mlp({.inputs = 3, .hidden = {4}, .classes = 2, .activation = Activation::relu});
}

// Parameters that differ per step, with the bit patterns a lossy round trip would break:
// a NaN with a payload, -0, the smallest subnormal and infinity.
inline Checkpoint make_checkpoint(const Model& model, std::int64_t step) {
  Checkpoint c;
  c.tensors = model.param_tensors();
  c.params = model.initial_parameters(static_cast<std::uint64_t>(step));
  const std::uint32_t nan_bits = 0x7fc01234u;
  std::memcpy(&c.params[0], &nan_bits, sizeof nan_bits);
  c.params[1] = -0.0f;
  c.params[2] = std::numeric_limits<float>::denorm_min();
  c.params[3] = std::numeric_limits<float>::infinity();
  c.state = {.step = step,
             .epoch = 3,
             .batch_in_epoch = 7,
             .samples = step * 64,
             .config_hash = 0xfeedfacecafebeefull,
             .workers = 2,
             .optimizer = OptimizerKind::adamw,
             .optimizer_steps = step,
             .seed = 9,
             .config = {}};  // as a state file before version 3 reads
  std::vector<float> m(c.params.size()), v(c.params.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    m[i] = 0.5f * static_cast<float>(i) - static_cast<float>(step);
    v[i] = 1e-3f * static_cast<float>(i * i);
  }
  c.optimizer_state = {{"adamw.m", m}, {"adamw.v", v}};
  return c;
}

// A checkpoint (step 5) of an untrained GPT of `spec` in `dir`, its metadata recording the
// architecture and the tokenizer as a GPT run's does: "bytes" (data.dataset text) or "ids".
inline std::filesystem::path save_gpt_checkpoint(const std::filesystem::path& dir,
                                                 const GptSpec& spec, const std::string& tokenizer) {
  const Model model = Model::gpt(spec);
  Checkpoint c;
  c.tensors = model.param_tensors();
  c.params = model.initial_parameters(7);
  c.state.step = 5;
  c.state.workers = 1;
  c.metadata = {{"lockstep.model", to_string(spec)}, {"lockstep.tokenizer", tokenizer}};
  CheckpointManager(dir, 0).save(c);
  return dir;
}

// An untrained GPT of `spec` as a checkpoint in memory, its metadata recording the architecture.
inline Checkpoint gpt_checkpoint(const GptSpec& spec, std::uint64_t seed) {
  const Model model = Model::gpt(spec);
  Checkpoint c;
  c.tensors = model.param_tensors();
  c.params = model.initial_parameters(seed);
  c.metadata["lockstep.model"] = to_string(spec);
  return c;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::string slurp(const std::filesystem::path& file) { return detail::read_input(file, detail::InputKind::checkpoint); }

inline void spit(const std::filesystem::path& file, std::string_view bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// The message of the InputError `f` throws; fails the test if it throws none.
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL_CHECK("no InputError");
  return "";
}

}  // namespace lockstep::test
