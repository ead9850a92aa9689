// Byte-pair encoding of one pre-token: start from one token per byte, and merge the adjacent
// pair of lowest priority (the leftmost among equals) until no adjacent pair may merge (Note
// [Two kinds of merge rule] in vocabulary.hpp says which pairs may).
#pragma once

#include <string_view>
#include <vector>

#include "text/vocabulary.hpp"

namespace lockstep::detail {

// How the lowest pair is found; both give the same ids.
enum class MergeSearch {
  scan,  // look at every pair after each merge: O(n^2), fastest for the short pieces of text
  heap,  // a heap of pairs, stale entries skipped: O(n log n), for long pieces (a run of letters)
  automatic,  // scan up to kScanPieceBytes, heap above
};

inline constexpr std::size_t kScanPieceBytes = 64;

// Note [Long pre-tokens]
// ~~~~~~~~~~~~~~~~~~~~~~
// A pre-token longer than kMaxPieceBytes (a run of tens of megabytes of letters, a base64 blob
// with no space) is encoded as consecutive pieces of at most kMaxPieceBytes, each cut at a UTF-8
// character boundary counted from the pre-token's start, each merged on its own. The merges of
// a whole pre-token hold about 30 bytes per byte of it (its ids, the list's links and the heap
// of pairs), so memory would grow with the input; this way it is at most about 2 MB per thread
// whatever the input. The cost: in such a pre-token the ids may differ from the tokenizers' and
// tiktoken's around each cut, where a merge across it is not made. No pre-token of natural text,
// code or data comes near 64 KiB; a test pins the rule (the ids equal those of the pieces
// encoded one by one) and another that shorter pre-tokens are merged whole.
inline constexpr std::size_t kMaxPieceBytes = 64u << 10;

// Appends the ids of `piece` (not empty) to `out`, by Note [Long pre-tokens] when it is longer
// than kMaxPieceBytes.
void byte_pair_encode(std::string_view piece, const Vocabulary& vocabulary,
                      std::vector<TokenId>& out, MergeSearch search = MergeSearch::automatic);

}  // namespace lockstep::detail
