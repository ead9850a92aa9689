// What a Tokenizer holds: the vocabulary, its pipeline, the compiled patterns, and per-thread scratch (the
// pattern's match state and a cache of pre-tokens already encoded).
#pragma once

#include <tbb/enumerable_thread_specific.h>

#include <array>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/tokenizer.hpp"
#include "text/pipeline.hpp"
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
  // The keys' and ids' bytes (the slots aside).
  std::size_t bytes() const noexcept { return keys_.size() + ids_.size() * sizeof(TokenId); }
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

// The per-thread cache: cleared when it holds kMaxCachedPieces or kMaxCacheBytes of keys and
// ids, so its memory is bounded (about 8 MB with its slots) whatever the pieces. A piece longer
// than kMaxCachedPieceBytes is not kept: such pieces rarely recur, and a few would fill it.
inline constexpr std::size_t kMaxCachedPieces = 1u << 16;
inline constexpr std::size_t kMaxCacheBytes = 4u << 20;
inline constexpr std::size_t kMaxCachedPieceBytes = 1u << 10;

struct ThreadScratch {
  PieceSplitter splitter;  // GPT-2's
  PieceTable cache;
  std::vector<std::string_view> pieces;
  // A pipeline's (Note [Tokenizer pipeline]): a splitter per Split step (null for the others),
  // the normalised text, the pieces of the next step, the pieces a prefix space made.
  std::vector<std::unique_ptr<PieceSplitter>> step_splitters;
  std::string normalized;
  std::vector<std::string_view> next_pieces;
  std::vector<MatchSpan> matches;
  std::deque<std::string> prefixed;
};

// Added tokens to split out of a text (Note [Tokenizer pipeline]), found by their first byte.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const noexcept { return tokens_.empty(); }
  struct Found {
    std::size_t begin, end;  // lstrip and rstrip included
    TokenId id;
  };
  // The first token in text[from, end), the longest there; nullopt when none.
  std::optional<Found> find(std::string_view text, std::size_t from) const;

 private:
  std::vector<AddedToken> tokens_;  // longest first
  std::array<bool, 256> first_byte_{};
};

struct TokenizerImpl {
  TokenizerImpl(Vocabulary v, std::filesystem::path from);  // GPT-2's pipeline
  TokenizerImpl(TokenizerSpec spec, std::filesystem::path from,
                TokenizerFamily family = TokenizerFamily::automatic);

  // Appends the ids of `text`: special tokens as text (allow_special false) or split out.
  void encode(std::string_view text, std::vector<TokenId>& out, bool allow_special) const;

  Vocabulary vocabulary;
  Pipeline pipeline;
  PieceTable whole_pieces;  // every token of the model, when vocabulary.whole_piece_lookup
  std::filesystem::path source;
  TokenizerFamily family;
  PretokenPattern pattern;  // GPT-2's
  // The added tokens split out: the raw text's and the normalised text's, with and without the
  // special ones.
  AddedTokenMatcher raw_added[2], normalized_added[2];
  mutable tbb::enumerable_thread_specific<ThreadScratch> scratch;

 private:
  // Text between added tokens; then its well-formed UTF-8 runs; then a piece.
  void encode_stretch(std::string_view text, std::vector<TokenId>& out, bool allow_special,
                      ThreadScratch& local) const;
  void encode_valid(std::string_view text, std::vector<TokenId>& out, bool allow_special,
                    ThreadScratch& local) const;
  void encode_pieces(std::string_view text, std::vector<TokenId>& out, ThreadScratch& local) const;
  void split_step(std::size_t step, ThreadScratch& local) const;
  void encode_piece(std::string_view piece, std::vector<TokenId>& out, ThreadScratch& local) const;
};

}  // namespace lockstep::detail
