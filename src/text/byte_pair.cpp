#include "text/byte_pair.hpp"

#include <cstdint>
#include <limits>
#include <queue>
#include <span>

namespace lockstep::detail {
namespace {

constexpr std::uint32_t kNoMerge = std::numeric_limits<std::uint32_t>::max();

std::uint32_t priority(const Vocabulary& v, TokenId left, TokenId right) {
  const Merge* m = v.find_merge(left, right);
  return m ? m->priority : kNoMerge;
}

// ids[i] and pair[i] = the priority of merging ids[i] with ids[i + 1].
void scan_merges(std::string_view piece, const Vocabulary& v, std::vector<TokenId>& out) {
  const std::size_t first = out.size();
  for (const char c : piece) out.push_back(v.byte_token[static_cast<unsigned char>(c)]);
  const std::span<TokenId> all(out.data() + first, piece.size());
  std::vector<std::uint32_t> pair(piece.size(), kNoMerge);
  for (std::size_t i = 0; i + 1 < all.size(); ++i) pair[i] = priority(v, all[i], all[i + 1]);
  std::size_t n = all.size();
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i)
      if (pair[i] < pair[best]) best = i;
    if (pair[best] == kNoMerge) break;
    all[best] = v.find_merge(all[best], all[best + 1])->merged;
    for (std::size_t i = best + 1; i + 1 < n; ++i) {
      all[i] = all[i + 1];
      pair[i] = pair[i + 1];
    }
    --n;
    pair[n - 1] = kNoMerge;
    if (best > 0) pair[best - 1] = priority(v, all[best - 1], all[best]);
    if (best + 1 < n) pair[best] = priority(v, all[best], all[best + 1]);
  }
  out.resize(first + n);
}

// The same merges, with the parts in a linked list and the pairs in a heap keyed by
// (priority, position of the left part): positions keep their order, so the heap's least live
// entry is the scan's choice. An entry is live while the pair at its position still merges
// with its priority.
void heap_merges(std::string_view piece, const Vocabulary& v, std::vector<TokenId>& out) {
  const auto n = static_cast<std::uint32_t>(piece.size());
  constexpr std::uint32_t kEnd = std::numeric_limits<std::uint32_t>::max();
  std::vector<TokenId> id(n);
  std::vector<std::uint32_t> next(n), prev(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    id[i] = v.byte_token[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : kEnd;
    prev[i] = i > 0 ? i - 1 : kEnd;
  }
  using Entry = std::uint64_t;  // priority << 32 | position
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  const auto push = [&](std::uint32_t at) {
    if (at == kEnd || next[at] == kEnd) return;
    const std::uint32_t p = priority(v, id[at], id[next[at]]);
    if (p != kNoMerge) heap.push((static_cast<Entry>(p) << 32) | at);
  };
  for (std::uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const auto at = static_cast<std::uint32_t>(top);
    // A merged-away part has prev and next cleared to itself below; its pair is stale.
    if (next[at] == kEnd || next[at] == at) continue;
    const Merge* m = v.find_merge(id[at], id[next[at]]);
    if (!m || m->priority != static_cast<std::uint32_t>(top >> 32)) continue;
    const std::uint32_t gone = next[at];
    id[at] = m->merged;
    next[at] = next[gone];
    if (next[gone] != kEnd) prev[next[gone]] = at;
    next[gone] = prev[gone] = gone;
    push(prev[at]);
    push(at);
  }
  for (std::uint32_t i = 0; i != kEnd; i = next[i]) out.push_back(id[i]);
}

}  // namespace

void byte_pair_encode(std::string_view piece, const Vocabulary& vocabulary,
                      std::vector<TokenId>& out, MergeSearch search) {
  while (piece.size() > kMaxPieceBytes) {  // Note [Long pre-tokens]
    std::size_t cut = kMaxPieceBytes;
    // Back to the first byte of the character the cut falls in (at most 3 continuation bytes;
    // bytes that are not UTF-8 at all are cut where they are).
    for (int back = 0; back < 3 && (static_cast<unsigned char>(piece[cut]) & 0xC0) == 0x80; ++back)
      --cut;
    if ((static_cast<unsigned char>(piece[cut]) & 0xC0) == 0x80) cut = kMaxPieceBytes;
    byte_pair_encode(piece.substr(0, cut), vocabulary, out, search);
    piece.remove_prefix(cut);
  }
  if (search == MergeSearch::automatic)
    search = piece.size() <= kScanPieceBytes ? MergeSearch::scan : MergeSearch::heap;
  if (search == MergeSearch::scan) scan_merges(piece, vocabulary, out);
  else heap_merges(piece, vocabulary, out);
}

}  // namespace lockstep::detail
