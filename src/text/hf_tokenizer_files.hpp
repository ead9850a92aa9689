// A tokenizer as the files of a Hugging Face GPT-2 directory, for `lockstep export --format hf`.
#pragma once

#include <filesystem>

#include "lockstep/tokenizer.hpp"

namespace lockstep::detail {

// Writes `tokenizer` into `dir` so that transformers' AutoTokenizer.from_pretrained(dir) reads
// it: a Hugging Face tokenizer's own files copied verbatim (tokenizer.json, vocab.json,
// merges.txt, tokenizer_config.json), a GPT-2 rank file's written as vocab.json and merges.txt
// (Note [merges.txt from ranks]), and, when the tokenizer has no tokenizer_config.json, one
// naming its bos and eos tokens (GPT-2: <|endoftext|> as bos, eos and unk). `context` is the
// model's (model_max_length). InputError when a rank file's vocabulary has a token that no
// merge of two lower-ranked tokens makes, or is of another family than GPT-2's.
void write_hf_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& dir, int context);

}  // namespace lockstep::detail
