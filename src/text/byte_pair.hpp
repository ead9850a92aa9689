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

// Appends the ids of `piece` (not empty) to `out`.
void byte_pair_encode(std::string_view piece, const Vocabulary& vocabulary,
                      std::vector<TokenId>& out, MergeSearch search = MergeSearch::automatic);

}  // namespace lockstep::detail
