// data.tokenizer: the tokenizer a config names, read for the data loader and for the trainer,
// which records it in checkpoints (record_tokenizer in lockstep/tokenizer.hpp).
#pragma once

#include <filesystem>

#include "lockstep/tokenizer.hpp"

namespace lockstep {
struct Config;
}

namespace lockstep::detail {

// Reads `path` (config.data.tokenizer, resolved) and checks it against model.vocab_size (unless
// 0, which takes the tokenizer's size). InputError naming data.tokenizer otherwise.
Tokenizer load_data_tokenizer(const Config& config, const std::filesystem::path& path);

}  // namespace lockstep::detail
