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

// Pre-token -> ids. Text repeats its words, so most pieces are found here; bounded by clearing
// when it holds kMaxPieces (a few MB).
class PieceCache {
 public:
  static constexpr std::size_t kMaxPieces = 1u << 16;
  // The ids of `piece` appended to `out`, or false when it is not cached.
  bool append(std::string_view piece, std::vector<TokenId>& out) const;
  void insert(std::string_view piece, std::span<const TokenId> ids);

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  struct Span {
    std::uint32_t offset, count;
  };
  std::unordered_map<std::string, Span, Hash, std::equal_to<>> index_;
  std::vector<TokenId> ids_;
};

struct ThreadScratch {
  PieceSplitter splitter;
  PieceCache cache;
  std::vector<std::string_view> pieces;
};

struct TokenizerImpl {
  TokenizerImpl(Vocabulary v, std::filesystem::path from);

  // Appends the ids of `text`, specials as text.
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out) const;

  Vocabulary vocabulary;
  std::filesystem::path source;
  PretokenPattern pattern;
  mutable tbb::enumerable_thread_specific<ThreadScratch> scratch;
};

}  // namespace lockstep::detail
