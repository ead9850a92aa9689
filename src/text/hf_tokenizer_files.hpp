// A tokenizer as the files of a Hugging Face GPT-2 directory, for `lockstep export --format hf`.
#pragma once

#include <filesystem>

#include "lockstep/tokenizer.hpp"

namespace lockstep::detail {

// Writes `tokenizer` into `dir` so that transformers' AutoTokenizer.from_pretrained(dir) reads
// it: a Hugging Face tokenizer's own files copied (tokenizer.json, vocab.json, merges.txt), a
// rank file's written as vocab.json and merges.txt (Note [merges.txt from ranks]), and
// tokenizer_config.json with <|endoftext|> as the bos, eos and unk token. `context` is the
// model's (model_max_length). InputError when a rank file's vocabulary has a token that no
// merge of two lower-ranked tokens makes.
void write_hf_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& dir, int context);

}  // namespace lockstep::detail
