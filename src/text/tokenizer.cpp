// Tokenizer: the vocabulary readers, pre-tokenisation and byte-pair merging put together.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <unordered_set>

#include "common/fnv1a.hpp"
#include "lockstep/config.hpp"
#include "lockstep/error.hpp"
#include "text/data_tokenizer.hpp"
#include "text/byte_pair.hpp"
#include "text/tokenizer_impl.hpp"

namespace lockstep {
namespace detail {

std::uint64_t PieceTable::hash(std::string_view piece) noexcept {
  // 8 bytes at a time, each word mixed by a multiply and a shift (pieces are short).
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ piece.size();
  while (piece.size() >= 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, piece.data(), 8);
    h = (h ^ word) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    piece.remove_prefix(8);
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, piece.data(), piece.size());
  h = (h ^ tail) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  return h | 1;  // never 0, the free slot's mark
}

bool PieceTable::append(std::string_view piece, std::uint64_t h, std::vector<TokenId>& out) const {
  if (slots_.empty()) return false;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == h && s.key_size == piece.size() &&
        std::memcmp(keys_.data() + s.key_offset, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids_offset, ids_.begin() + s.ids_offset + s.ids_size);
      return true;
    }
  }
}

void PieceTable::insert(std::string_view piece, std::uint64_t h, std::span<const TokenId> ids) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = h & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = {h, static_cast<std::uint32_t>(keys_.size()),
               static_cast<std::uint32_t>(piece.size()), static_cast<std::uint32_t>(ids_.size()),
               static_cast<std::uint32_t>(ids.size())};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++size_;
}

void PieceTable::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  size_ = 0;
}

void PieceTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 4096 : 2 * old.size(), Slot{});
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    std::size_t i = s.hash & mask;
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

TokenizerImpl::TokenizerImpl(Vocabulary v, std::filesystem::path from)
    : vocabulary(std::move(v)),
      source(std::move(from)),
      scratch([this] { return ThreadScratch{PieceSplitter(pattern), {}, {}}; }) {
  if (vocabulary.whole_piece_lookup)
    for (TokenId id = 0; id < vocabulary.tokens.size(); ++id)
      if (id != vocabulary.end_of_text) {
        const std::string& t = vocabulary.tokens[id];
        whole_pieces.insert(t, PieceTable::hash(t), std::span(&id, 1));
      }
}

void TokenizerImpl::encode_ordinary(std::string_view text, std::vector<TokenId>& out) const {
  ThreadScratch& local = scratch.local();
  local.splitter.split(text, local.pieces);
  for (const std::string_view piece : local.pieces) {
    if (piece.size() == 1) {
      out.push_back(vocabulary.byte_token[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    const std::uint64_t h = PieceTable::hash(piece);
    if (whole_pieces.append(piece, h, out) || local.cache.append(piece, h, out)) continue;
    const std::size_t first = out.size();
    byte_pair_encode(piece, vocabulary, out);
    if (local.cache.size() >= kMaxCachedPieces) local.cache.clear();
    local.cache.insert(piece, h, std::span(out).subspan(first));
  }
}

}  // namespace detail

Tokenizer::Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  return Tokenizer(
      std::make_shared<const detail::TokenizerImpl>(detail::read_vocabulary(path), path));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  encode(text, out);
  return out;
}

void Tokenizer::encode(std::string_view text, std::vector<TokenId>& out) const {
  impl_->encode_ordinary(text, out);
}

std::vector<TokenId> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<TokenId> out;
  const std::optional<TokenId> eot = impl_->vocabulary.end_of_text;
  while (eot) {
    const std::size_t at = text.find(detail::kEndOfText);
    if (at == std::string_view::npos) break;
    impl_->encode_ordinary(text.substr(0, at), out);
    out.push_back(*eot);
    text.remove_prefix(at + detail::kEndOfText.size());
  }
  impl_->encode_ordinary(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (const TokenId id : ids) out += token_bytes(id);
  return out;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  const std::vector<std::string>& tokens = impl_->vocabulary.tokens;
  if (id >= tokens.size())
    throw InputError(fmt::format("token id {}: outside the vocabulary of {} ({})", id,
                                 tokens.size(), impl_->source.string()));
  return tokens[id];
}

std::size_t Tokenizer::vocab_size() const noexcept { return impl_->vocabulary.tokens.size(); }

std::optional<TokenId> Tokenizer::end_of_text() const noexcept {
  return impl_->vocabulary.end_of_text;
}

const std::filesystem::path& Tokenizer::source() const noexcept { return impl_->source; }

std::string Tokenizer::content_hash() const {
  const detail::Vocabulary& v = impl_->vocabulary;
  std::uint64_t h = detail::kFnv1a64Basis;
  const auto feed_u64 = [&](std::uint64_t x) { h = detail::fnv1a64(&x, sizeof x, h); };
  feed_u64(v.tokens.size());
  for (const std::string& t : v.tokens) {
    feed_u64(t.size());
    h = detail::fnv1a64(t.data(), t.size(), h);
  }
  feed_u64(v.end_of_text ? *v.end_of_text : ~std::uint64_t{0});
  // The merged tokens in the order they merge (a rank file lists every split of a token, all
  // at its rank; merges.txt one): the order alone decides the ids, whichever file gave them.
  std::vector<std::pair<std::uint32_t, TokenId>> order;
  order.reserve(v.merges.size());
  for (const detail::Merge& m : v.merges.merges()) order.emplace_back(m.priority, m.merged);
  std::sort(order.begin(), order.end());
  std::unordered_set<TokenId> seen;
  for (const auto& [priority, merged] : order)
    if (seen.insert(merged).second) feed_u64(merged);
  return fmt::format("{:016x}", h);
}

namespace {
// Where a lost or changed tokenizer comes back from: the checkpoint records only its hash.
constexpr std::string_view kOriginalTokenizer =
    "--tokenizer DIR|FILE naming a copy of the original (the files it was trained with: from "
    "where they came, or from the directory of a `lockstep export --format hf` of this run, "
    "which holds them)";
constexpr std::string_view kKindKey = "lockstep.tokenizer", kHashKey = "lockstep.tokenizer.hash",
                           kPathKey = "lockstep.tokenizer.path", kBpe = "bpe";
}  // namespace

void record_tokenizer(std::map<std::string, std::string>& metadata, const Tokenizer& tokenizer) {
  metadata[std::string(kKindKey)] = kBpe;
  metadata[std::string(kHashKey)] = tokenizer.content_hash();
  metadata[std::string(kPathKey)] =
      std::filesystem::absolute(tokenizer.source()).lexically_normal().string();
}

std::optional<Tokenizer> recorded_tokenizer(const std::map<std::string, std::string>& metadata,
                                            const std::filesystem::path& file,
                                            const std::filesystem::path& path) {
  const auto kind = metadata.find(std::string(kKindKey));
  const auto hash = metadata.find(std::string(kHashKey));
  const auto recorded_path = metadata.find(std::string(kPathKey));
  if (kind == metadata.end() || kind->second != kBpe || hash == metadata.end()) {
    if (path.empty()) return std::nullopt;
    return Tokenizer::load(path);
  }
  const std::string recorded = recorded_path == metadata.end() ? "" : recorded_path->second;
  if (path.empty() && recorded.empty())
    throw InputError(fmt::format("{}: the checkpoint records a tokenizer (hash {}) but not where "
                                 "it is: give {}",
                                 file.string(), hash->second, kOriginalTokenizer));
  if (path.empty() && !std::filesystem::exists(recorded))
    throw InputError(fmt::format("{}: the tokenizer it was trained with, {}, is gone (no such "
                                 "file or directory; content hash {}): give {}",
                                 file.string(), recorded, hash->second, kOriginalTokenizer));
  Tokenizer tokenizer = Tokenizer::load(path.empty() ? std::filesystem::path(recorded) : path);
  if (const std::string mine = tokenizer.content_hash(); mine != hash->second)
    throw InputError(fmt::format(
        "{}: trained with the tokenizer {} (content hash {}), but {} has content hash {}: not the "
        "same vocabulary and merges. {}{}", file.string(), recorded.empty() ? "?" : recorded,
        hash->second, tokenizer.source().string(), mine,
        path.empty() ? "It has changed since: put the original back there, or give " : "Give ",
        kOriginalTokenizer));
  return tokenizer;
}

namespace detail {

Tokenizer load_data_tokenizer(const Config& config, const std::filesystem::path& path) {
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::load(path);
  } catch (const InputError& e) {
    throw InputError(fmt::format("data.tokenizer: {}", e.what()));
  }
  const int vocab = config.model.vocab_size;
  if (vocab != 0 && tokenizer->vocab_size() > static_cast<std::size_t>(vocab))
    throw InputError(fmt::format("data.tokenizer {} has {} ids, more than model.vocab_size {}: "
                                 "set model.vocab_size to at least {} (or leave it unset)",
                                 path.string(), tokenizer->vocab_size(), vocab,
                                 tokenizer->vocab_size()));
  return *std::move(tokenizer);
}

}  // namespace detail
}  // namespace lockstep
