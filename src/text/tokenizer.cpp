// Tokenizer: the vocabulary readers, pre-tokenisation and byte-pair merging put together.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "common/fnv1a.hpp"
#include "lockstep/error.hpp"
#include "text/byte_pair.hpp"
#include "text/tokenizer_impl.hpp"

namespace lockstep {
namespace detail {

bool PieceCache::append(std::string_view piece, std::vector<TokenId>& out) const {
  const auto it = index_.find(piece);
  if (it == index_.end()) return false;
  const auto first = ids_.begin() + it->second.offset;
  out.insert(out.end(), first, first + it->second.count);
  return true;
}

void PieceCache::insert(std::string_view piece, std::span<const TokenId> ids) {
  if (index_.size() >= kMaxPieces) {
    index_.clear();
    ids_.clear();
  }
  index_.emplace(piece, Span{static_cast<std::uint32_t>(ids_.size()),
                             static_cast<std::uint32_t>(ids.size())});
  ids_.insert(ids_.end(), ids.begin(), ids.end());
}

TokenizerImpl::TokenizerImpl(Vocabulary v, std::filesystem::path from)
    : vocabulary(std::move(v)),
      source(std::move(from)),
      scratch([this] { return ThreadScratch{PieceSplitter(pattern), {}, {}}; }) {}

void TokenizerImpl::encode_ordinary(std::string_view text, std::vector<TokenId>& out) const {
  ThreadScratch& local = scratch.local();
  local.splitter.split(text, local.pieces);
  for (const std::string_view piece : local.pieces) {
    if (piece.size() == 1) {
      out.push_back(vocabulary.byte_token[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (local.cache.append(piece, out)) continue;
    const std::size_t first = out.size();
    const auto whole = vocabulary.whole_piece_lookup ? vocabulary.by_bytes.find(std::string(piece))
                                                     : vocabulary.by_bytes.end();
    if (whole != vocabulary.by_bytes.end()) out.push_back(whole->second);
    else byte_pair_encode(piece, vocabulary, out);
    local.cache.insert(piece, std::span(out).subspan(first));
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
  for (const auto& [pair, m] : v.merges) order.emplace_back(m.priority, m.merged);
  std::sort(order.begin(), order.end());
  std::unordered_set<TokenId> seen;
  for (const auto& [priority, merged] : order)
    if (seen.insert(merged).second) feed_u64(merged);
  return fmt::format("{:016x}", h);
}

}  // namespace lockstep
