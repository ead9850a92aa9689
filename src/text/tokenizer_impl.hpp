// What a Tokenizer holds: the vocabulary, the compiled pattern, and per-thread scratch (the
// pattern's match state and a cache of pre-tokens already encoded).
#pragma once

#include <tbb/enumerable_thread_specific.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/tokenizer.hpp"
#include "text/pretokenize.hpp"
#include "text/vocabulary.hpp"

namespace lockstep::detail {

// Pre-token -> ids, in one array probed linearly, with the keys and ids in two arenas: a
// lookup costs one hash of the piece and, mostly, one cache line (node-based maps spent half the
// encode time of non-English text in their lookups). Used twice: every token of a rank file
// (the whole-piece shortcut), and per thread as the cache of pieces already encoded.
class PieceTable {
 public:
  static std::uint64_t hash(std::string_view piece) noexcept;
  // The ids stored for `piece` (whose hash() is `h`), appended to `out`; false when absent.
  bool append(std::string_view piece, std::uint64_t h, std::vector<TokenId>& out) const;
  // Stores `piece` -> `ids` (not already present).
  void insert(std::string_view piece, std::uint64_t h, std::span<const TokenId> ids);
  std::size_t size() const noexcept { return size_; }
  void clear();

 private:
  struct Slot {
    std::uint64_t hash = 0;  // 0: free (hash() never returns 0)
    std::uint32_t key_offset = 0, key_size = 0, ids_offset = 0, ids_size = 0;
  };
  void grow();
  std::vector<Slot> slots_;  // a power of two, at most half full
  std::string keys_;
  std::vector<TokenId> ids_;
  std::size_t size_ = 0;
};

// The per-thread cache: cleared when it holds kMaxPieces (a few MB), so its memory is bounded.
inline constexpr std::size_t kMaxCachedPieces = 1u << 16;

struct ThreadScratch {
  PieceSplitter splitter;
  PieceTable cache;
  std::vector<std::string_view> pieces;
};

struct TokenizerImpl {
  TokenizerImpl(Vocabulary v, std::filesystem::path from);

  // Appends the ids of `text`, specials as text.
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out) const;

  Vocabulary vocabulary;
  PieceTable whole_pieces;  // every token, when vocabulary.whole_piece_lookup
  std::filesystem::path source;
  PretokenPattern pattern;
  mutable tbb::enumerable_thread_specific<ThreadScratch> scratch;
};

}  // namespace lockstep::detail
