// Hugging Face weight directories (load_weights on a directory with config.json; src/io/
// hf_weights.cpp, hf_model.cpp): single-file and sharded, F32, BF16 and F16 widened exactly,
// export --format hf's shards, and every bad directory refused naming the file and the tensor.
// The files are made here: by export_hf, or byte by byte for what lockstep never writes.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint_fixtures.hpp"
#include "common/bf16.hpp"
#include "io/hf_model.hpp"
#include "io/safetensors_reader.hpp"
#include "lockstep/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace lockstep;
using lockstep::test::TempDir;

namespace {

// One tensor of a hand-made safetensors file: its dtype and its bytes as stored.
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

void write_safetensors_raw(const fs::path& file, const std::vector<RawTensor>& tensors) {
  std::string header = "{", data;
  for (const RawTensor& t : tensors) {
    header += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", t.name, t.dtype, fmt::join(t.shape, ","),
                          data.size(), data.size() + t.bytes.size());
    data += t.bytes;
  }
  header += "}";
  const std::uint64_t size = header.size();
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << header << data;
}

template <class T>
std::string bytes_of(const std::vector<T>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)};
}

std::string f32_bytes(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return bytes_of(v);
}

// A Llama config.json of 2 layers, width 8, 2 heads, 1 kv head, intermediate 12, vocab 10.
constexpr std::string_view kLlamaConfig =
    R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 10,
        "max_position_embeddings": 32, "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "bos_token_id": 1,
        "eos_token_id": [2, 3]})";

// The Llama parameters of that config, in the decoder's storage order, and each one's file
// tensor (F32, values from 1 + the tensor's index).
std::vector<ParamTensor> llama_tensors() {
  const std::pair<std::string, std::vector<std::int64_t>> shapes[] = {
      {"model.embed_tokens.weight", {10, 8}},
      {"model.layers.0.input_layernorm.weight", {8}},
      {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
      {"model.layers.0.post_attention_layernorm.weight", {8}},
      {"model.layers.0.mlp.gate_proj.weight", {12, 8}},
      {"model.layers.0.mlp.up_proj.weight", {12, 8}},
      {"model.layers.0.mlp.down_proj.weight", {8, 12}},
      {"model.norm.weight", {8}},
      {"lm_head.weight", {10, 8}}};
  std::vector<ParamTensor> out;
  std::size_t offset = 0;
  for (const auto& [name, shape] : shapes) {
    out.push_back({name, offset, shape});
    offset += out.back().numel();
  }
  return out;
}

std::vector<RawTensor> llama_file_tensors() {
  std::vector<RawTensor> out;
  float start = 1;
  for (const ParamTensor& t : llama_tensors()) {
    out.push_back({t.name, "F32", t.shape, f32_bytes(t.numel(), start)});
    start += 1;
  }
  return out;
}

// A Llama directory of one file, or of shards with an index, from `tensors`.
fs::path llama_dir(const TempDir& tmp, const std::string& name, const std::vector<RawTensor>& tensors,
                   std::size_t shards = 1, std::string_view config = kLlamaConfig) {
  const fs::path dir = tmp.path() / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config;
  if (shards == 1) {
    write_safetensors_raw(dir / "model.safetensors", tensors);
    return dir;
  }
  std::string map;
  for (std::size_t s = 0; s < shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    std::vector<RawTensor> part;
    for (std::size_t i = s; i < tensors.size(); i += shards) {
      part.push_back(tensors[i]);
      map += fmt::format("{}\"{}\": \"{}\"", map.empty() ? "" : ", ", tensors[i].name, file);
    }
    write_safetensors_raw(dir / file, part);
  }
  std::ofstream(dir / "model.safetensors.index.json")
      << "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" << map << "}}";
  return dir;
}

std::string load_error(const fs::path& dir, const std::vector<ParamTensor>& expected = llama_tensors()) {
  return lockstep::test::input_error_of([&] { load_weights(dir, expected); });
}

}  // namespace

TEST_CASE("hf weights: a sharded BF16 export (and a torch one) loads as the F32 one rounded, and one file replaces the shards") {
  const TempDir dir;
  const GptSpec spec{.vocab_size = 30, .context = 8, .n_layer = 2, .n_head = 2, .d_model = 8};
  const Checkpoint c = lockstep::test::gpt_checkpoint(spec, 5);
  const fs::path whole = dir.path() / "whole", sharded = dir.path() / "sharded";
  export_hf(c, whole, TensorDtype::f32);
  export_hf(c, sharded, TensorDtype::bf16, nullptr, /*max_shard_bytes=*/1000);

  CHECK(fs::exists(whole / "model.safetensors"));
  CHECK(!fs::exists(whole / "model.safetensors.index.json"));
  CHECK(!fs::exists(sharded / "model.safetensors"));
  REQUIRE(fs::exists(sharded / "model.safetensors.index.json"));
  std::size_t shards = 0;
  for (const auto& entry : fs::directory_iterator(sharded))
    if (entry.path().filename().string().starts_with("model-")) {
      ++shards;
      // Each shard at most 1000 bytes of data unless one tensor alone is larger.
      const detail::SafetensorsReader shard(entry.path());
      std::uint64_t bytes = 0;
      for (const auto& t : shard.tensors()) bytes += t.end - t.begin;
      CHECK((bytes <= 1000 || shard.tensors().size() == 1));
    }
  CHECK(shards > 2);
  CHECK(fs::exists(sharded / "generation_config.json"));

  const Weights f32 = load_weights(whole, c.tensors), bf16 = load_weights(sharded, c.tensors);
  CHECK(lockstep::test::same_bits(f32.params, c.params));
  std::vector<float> rounded = c.params;
  for (float& x : rounded) x = detail::round_to_bf16(x);
  CHECK(lockstep::test::same_bits(bf16.params, rounded));
  CHECK(bf16.metadata.at("lockstep.model") == to_string(spec));
  CHECK(bf16.file == sharded / "model.safetensors.index.json");
  // An export --format torch --dtype bf16 loads widened too.
  export_torch(c, dir.path() / "torch.safetensors", TensorDtype::bf16);
  CHECK(lockstep::test::same_bits(load_weights(dir.path() / "torch.safetensors", c.tensors).params, rounded));

  // The ids a checkpoint records (Note [Hugging Face token ids]) are config.json's and
  // generation_config.json's.
  Checkpoint with_ids = c;
  with_ids.metadata["lockstep.eos_token_ids"] = "[7, 9]";
  export_hf(with_ids, dir.path() / "ids", TensorDtype::f32);
  for (const char* file : {"config.json", "generation_config.json"})
    CHECK(lockstep::test::slurp(dir.path() / "ids" / file).find("\"eos_token_id\": [7, 9]") != std::string::npos);

  // One file into the sharded directory: the shards and the index go, from_pretrained reads the file.
  export_hf(c, sharded, TensorDtype::f32);
  for (const auto& entry : fs::directory_iterator(sharded))
    CHECK(!entry.path().filename().string().starts_with("model-"));
  CHECK(!fs::exists(sharded / "model.safetensors.index.json"));
  CHECK(lockstep::test::same_bits(load_weights(sharded, c.tensors).params, c.params));
}

TEST_CASE("hf weights: Llama tensors load by name from shards in any order, and F16 and BF16 widen exactly") {
  const TempDir dir;
  const std::vector<ParamTensor> expected = llama_tensors();
  std::vector<RawTensor> tensors = llama_file_tensors();
  // The norm in F16 (1.5, a subnormal 2^-24, -0, 65504 and 2^-14), the final norm in BF16.
  tensors[1] = {tensors[1].name, "F16", {8},
                bytes_of(std::vector<std::uint16_t>{0x3E00, 0x0001, 0x8000, 0x7BFF, 0x0400, 0x3C00, 0xC000, 0x03FF})};
  tensors[10] = {tensors[10].name, "BF16", {8},
                 bytes_of(std::vector<std::uint16_t>{0x3FC0, 0x0001, 0x8000, 0x7F7F, 0x3F80, 0xBF80, 0x4000, 0x4040})};
  const Weights one = load_weights(llama_dir(dir, "one", tensors), expected);
  const Weights three = load_weights(llama_dir(dir, "three", tensors, 3), expected);
  CHECK(lockstep::test::same_bits(one.params, three.params));
  // config.json's ids go with the weights (Note [Hugging Face token ids]).
  CHECK(one.metadata.at("lockstep.bos_token_ids") == "[1]");
  CHECK(one.metadata.at("lockstep.eos_token_ids") == "[2, 3]");
  const float f16[] = {1.5f, 0x1p-24f, -0.0f, 65504.0f, 0x1p-14f, 1.0f, -2.0f, 1023 * 0x1p-24f};
  const float b16[] = {1.5f, detail::bf16_to_float(1), -0.0f, detail::bf16_to_float(0x7F7F), 1.0f, -1.0f, 2.0f, 3.0f};
  for (std::size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(&one.params[expected[1].offset + i], &f16[i], 4) == 0);
    CHECK(std::memcmp(&one.params[expected[10].offset + i], &b16[i], 4) == 0);
  }
  CHECK(one.params[expected[11].offset] == 12.0f);  // lm_head, the 12th tensor: 1 + 11
  CHECK(one.params[expected[0].offset + 3] == 1.75f);
  // Older files carry RoPE's frequencies as a buffer, computed from rope_theta: skipped.
  std::vector<RawTensor> with_buffer = tensors;
  with_buffer.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, f32_bytes(2, 0)});
  CHECK(lockstep::test::same_bits(load_weights(llama_dir(dir, "buffer", with_buffer), expected).params,
                                  one.params));
}

TEST_CASE("hf weights: a bad directory is refused naming the file and the tensor") {
  const TempDir dir;
  const std::vector<RawTensor> good = llama_file_tensors();
  SUBCASE("no weights") {
    const fs::path d = dir.path() / "none";
    fs::create_directories(d);
    std::ofstream(d / "config.json") << kLlamaConfig;
    CHECK(load_error(d) == fmt::format("{}: no weights: expected model.safetensors or "
                                       "model.safetensors.index.json (a Hugging Face model directory)",
                                       d.string()));
  }
  SUBCASE("a weight_map naming a missing shard") {
    const fs::path d = llama_dir(dir, "d", good, 2);
    fs::remove(d / "model-00002-of-00002.safetensors");
    // (The weight_map's first tensor, by name, in that shard.)
    CHECK(load_error(d) == fmt::format("{}/model.safetensors.index.json: weight_map: tensor "
                                       "'lm_head.weight' is in "
                                       "model-00002-of-00002.safetensors, which does not exist in {}",
                                       d.string(), d.string()));
  }
  // The first of two shards rewritten without the tensor `drop`, with `add` after its own.
  const auto first_shard = [&](const fs::path& d, std::string_view drop, const std::vector<RawTensor>& add) {
    std::vector<RawTensor> first;
    for (std::size_t i = 0; i < good.size(); i += 2)
      if (good[i].name != drop) first.push_back(good[i]);
    first.insert(first.end(), add.begin(), add.end());
    write_safetensors_raw(d / "model-00001-of-00002.safetensors", first);
  };
  SUBCASE("a tensor missing from the shard the weight_map names") {
    const fs::path d = llama_dir(dir, "d", good, 2);
    first_shard(d, "model.norm.weight", {});
    CHECK(load_error(d) == fmt::format("{}/model-00001-of-00002.safetensors: tensor 'model.norm.weight': "
                                       "missing, though model.safetensors.index.json's weight_map puts "
                                       "it in this file", d.string()));
  }
  SUBCASE("a shard's tensor the weight_map puts elsewhere") {
    const fs::path d = llama_dir(dir, "d", good, 2);
    first_shard(d, "", {good[1]});
    CHECK(load_error(d) == fmt::format("{}/model-00001-of-00002.safetensors: tensor "
                                       "'model.layers.0.input_layernorm.weight': "
                                       "model.safetensors.index.json's weight_map puts it in "
                                       "model-00002-of-00002.safetensors", d.string()));
  }
  SUBCASE("one tensor changed, added or dropped") {
    struct Edit {
      std::function<void(std::vector<RawTensor>&)> edit;
      std::size_t shards;
      std::string message;  // after "DIR/"
    };
    const Edit edits[] = {
        {[](auto& t) { t[3] = {t[3].name, "F32", {8, 8}, f32_bytes(64, 0)}; },  // k_proj of 2 kv heads
         1, "model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': shape [8, 8] in "
            "the file, [4, 8] in the config's model"},
        {[](auto& t) { t[10] = {t[10].name, "I64", {8}, std::string(64, '\0')}; }, 1,
         "model.safetensors: tensor 'model.norm.weight': dtype I64: expected F32, BF16 or F16 (the "
         "floating-point dtypes lockstep widens to fp32)"},
        {[](auto& t) { t.push_back({"model.layers.0.self_attn.q_norm.weight", "BF16", {4}, std::string(8, '\0')}); },
         1, "model.safetensors: tensor 'model.layers.0.self_attn.q_norm.weight' (shape [4]): not in "
            "the config's model; lockstep loads no tensor it does not model"},
        {[](auto& t) { t.pop_back(); },  // an untied head's
         2, "model.safetensors.index.json: tensor 'lm_head.weight': missing; the config's model has "
            "shape [10, 8]"}};
    for (std::size_t i = 0; i < std::size(edits); ++i) {
      CAPTURE(edits[i].message);
      std::vector<RawTensor> t = good;
      edits[i].edit(t);
      const fs::path d = llama_dir(dir, std::to_string(i), t, edits[i].shards);
      CHECK(load_error(d) == d.string() + "/" + edits[i].message);
    }
  }
  SUBCASE("a truncated shard") {
    const fs::path d = llama_dir(dir, "d", good, 2);
    const fs::path shard = d / "model-00002-of-00002.safetensors";
    fs::resize_file(shard, fs::file_size(shard) - 4);
    CHECK(load_error(d).starts_with(shard.string() + ": offset "));
  }
}

TEST_CASE("hf weights: max_shard_size reads as transformers' does") {
  CHECK(detail::parse_shard_size("5GB") == 5'000'000'000ull);
  CHECK(detail::parse_shard_size("500MB") == 500'000'000ull);
  CHECK(detail::parse_shard_size("100KB") == 100'000ull);
  CHECK(detail::parse_shard_size("2GiB") == 2ull << 30);
  CHECK(detail::parse_shard_size("512MiB") == 512ull << 20);
  CHECK(detail::parse_shard_size("64KiB") == 64ull << 10);
  CHECK(detail::parse_shard_size("1234") == 1234ull);
  for (const char* bad : {"", "0", "5 GB", "5gb", "-1", "GB", "5TB", "99999999999999999999GB"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(detail::parse_shard_size(bad), std::invalid_argument);
  }
}
