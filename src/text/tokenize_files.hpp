// The parts of tokenize_files (lockstep/tokenizer.hpp) that tests reach into.
#pragma once

#include <cstddef>
#include <string_view>

#include "text/pipeline.hpp"  // CutRule

namespace lockstep::detail {

// A long document is cut into parts of about this many bytes (Note [Tokenizing files]).
inline constexpr std::size_t kPartBytes = 16u << 10;
// Text tokenized at once, in parallel; the memory bound is a few times this.
inline constexpr std::size_t kBatchBytes = 4u << 20;
// Batches read ahead of the one being encoded (Note [Tokenizing files], "Overlap").
inline constexpr std::size_t kBatchesAhead = 1;
// The longest stretch of a document without a cut (Note [Tokenizing files], "Forced cuts").
inline constexpr std::size_t kMaxStretchBytes = 1u << 20;

// The first offset p >= from at which `text` may be cut without changing its ids under `rule`
// (a tokenizer's, Note [Tokenizing files]): encoding text[0, p) and text[p, end) gives the ids
// of text. npos when there is none.
std::size_t safe_cut(std::string_view text, std::size_t from,
                     CutRule rule = CutRule::gpt2) noexcept;

// Where the part that starts `text` ends: the first safe cut at or past `from` (at least
// kPartBytes) when one lies within kMaxStretchBytes, else, when text holds more than
// kMaxStretchBytes + 1 bytes, the forced cut: kMaxStretchBytes, moved back to the first byte of
// the UTF-8 character it falls in. npos: no cut in the text so far (more text may bring one).
std::size_t part_cut(std::string_view text, std::size_t from, CutRule rule) noexcept;

}  // namespace lockstep::detail
