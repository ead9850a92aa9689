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
#include "text/normalize.hpp"
#include "io/json.hpp"
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

namespace {

// Unicode's White_Space code point ending at text[end) (Rust's char::is_whitespace, which
// `tokenizers` strips with): its length in bytes, or 0.
std::size_t white_space_before(std::string_view text, std::size_t end) {
  if (end == 0) return 0;
  const auto c = static_cast<unsigned char>(text[end - 1]);
  if (c < 0x80) return (c == ' ' || (c >= '\t' && c <= '\r')) ? 1 : 0;
  std::size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80 && end - begin < 4)
    --begin;
  const std::string_view s = text.substr(begin, end - begin);
  static constexpr std::string_view kSpaces[] = {
      "\u0085", "\u00A0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004",
      "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200A", "\u2028", "\u2029",
      "\u202F", "\u205F", "\u3000"};
  for (const std::string_view space : kSpaces)
    if (s == space) return s.size();
  return 0;
}

std::size_t white_space_after(std::string_view text, std::size_t begin) {
  if (begin >= text.size()) return 0;
  const auto c = static_cast<unsigned char>(text[begin]);
  if (c < 0x80) return (c == ' ' || (c >= '\t' && c <= '\r')) ? 1 : 0;
  const std::size_t length = utf8_sequence_at(text, begin);
  return length && white_space_before(text, begin + length) == length ? length : 0;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty(); });
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& t : tokens_) first_byte_[static_cast<unsigned char>(t.content[0])] = true;
}

std::optional<AddedTokenMatcher::Found> AddedTokenMatcher::find(std::string_view text,
                                                                std::size_t from) const {
  for (std::size_t at = from; at < text.size(); ++at) {
    if (!first_byte_[static_cast<unsigned char>(text[at])]) continue;
    for (const AddedToken& t : tokens_) {
      if (text.compare(at, t.content.size(), t.content) != 0) continue;
      Found f{at, at + t.content.size(), t.id};
      if (t.lstrip)
        while (const std::size_t n = white_space_before(text.substr(from), f.begin - from))
          f.begin -= n;
      if (t.rstrip)
        while (const std::size_t n = white_space_after(text, f.end)) f.end += n;
      return f;
    }
  }
  return std::nullopt;
}

TokenizerImpl::TokenizerImpl(Vocabulary v, std::filesystem::path from)
    : TokenizerImpl(
          [&] {
            Pipeline p = family_pipeline(TokenizerFamily::gpt2, v, from.string());
            return TokenizerSpec{std::move(v), std::move(p)};
          }(),
          std::move(from)) {}

TokenizerImpl::TokenizerImpl(TokenizerSpec spec, std::filesystem::path from, TokenizerFamily f)
    : vocabulary(std::move(spec.vocabulary)),
      pipeline(std::move(spec.pipeline)),
      source(std::move(from)),
      family(f),
      scratch([this] {
        ThreadScratch local{PieceSplitter(pattern), {}, {}, {}, {}, {}, {}, {}};
        for (const PreTokenizerStep& step : pipeline.steps)
          local.step_splitters.push_back(
              step.pattern ? std::make_unique<PieceSplitter>(*step.pattern) : nullptr);
        return local;
      }) {
  if (vocabulary.whole_piece_lookup) {
    std::vector<bool> outside(vocabulary.tokens.size());
    for (const TokenId id : vocabulary.outside_model) outside[id] = true;
    for (TokenId id = 0; id < vocabulary.tokens.size(); ++id)
      if (!outside[id]) {
        const std::string& t = vocabulary.tokens[id];
        whole_pieces.insert(t, PieceTable::hash(t), std::span(&id, 1));
      }
  }
  // [0]: special tokens as text; [1]: split out. Without a normaliser, every token is matched
  // in the raw text.
  for (const bool special : {false, true}) {
    std::vector<AddedToken> raw, normalized;
    for (const AddedToken& t : pipeline.added)
      if (special || !t.special) (t.normalized && pipeline.nfc ? normalized : raw).push_back(t);
    raw_added[special] = AddedTokenMatcher(std::move(raw));
    normalized_added[special] = AddedTokenMatcher(std::move(normalized));
  }
}

// Inlined into the loops over pieces: a call per piece costs English text measurably.
[[gnu::always_inline]] inline void TokenizerImpl::encode_piece(std::string_view piece, std::vector<TokenId>& out,
                                 ThreadScratch& local) const {
  if (piece.size() == 1) {
    out.push_back(vocabulary.byte_token[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const std::uint64_t h = PieceTable::hash(piece);
  if (whole_pieces.append(piece, h, out) || local.cache.append(piece, h, out)) return;
  const std::size_t first = out.size();
  byte_pair_encode(piece, vocabulary, out);
  if (piece.size() > kMaxCachedPieceBytes) return;
  if (local.cache.size() >= kMaxCachedPieces || local.cache.bytes() >= kMaxCacheBytes)
    local.cache.clear();
  local.cache.insert(piece, h, std::span(out).subspan(first));
}

void TokenizerImpl::encode(std::string_view text, std::vector<TokenId>& out,
                           bool allow_special) const {
  ThreadScratch& local = scratch.local();
  const AddedTokenMatcher& added = raw_added[allow_special];
  if (added.empty()) return encode_stretch(text, out, allow_special, local);
  for (std::size_t at = 0; at < text.size();) {
    const std::optional<AddedTokenMatcher::Found> found = added.find(text, at);
    const std::size_t stop = found ? found->begin : text.size();
    encode_stretch(text.substr(at, stop - at), out, allow_special, local);
    if (!found) break;
    out.push_back(found->id);
    at = found->end;
  }
}

void TokenizerImpl::encode_stretch(std::string_view text, std::vector<TokenId>& out,
                                   bool allow_special, ThreadScratch& local) const {
  if (pipeline.gpt2) {
    local.splitter.split(text, local.pieces);
    for (const std::string_view piece : local.pieces) encode_piece(piece, out, local);
    return;
  }
  // Well-formed runs through the pipeline, bad runs one piece each (Note [Tokenizer pipeline]).
  while (!text.empty()) {
    const std::size_t bad = std::min(invalid_utf8_at(text), text.size());
    if (bad > 0) encode_valid(text.substr(0, bad), out, allow_special, local);
    std::size_t good = bad;
    while (good < text.size() && utf8_sequence_at(text, good) == 0) ++good;
    if (good > bad) encode_piece(text.substr(bad, good - bad), out, local);
    text.remove_prefix(good);
  }
}

void TokenizerImpl::encode_valid(std::string_view text, std::vector<TokenId>& out,
                                 bool allow_special, ThreadScratch& local) const {
  if (!pipeline.nfc) return encode_pieces(text, out, local);
  nfc(text, local.normalized);
  const std::string_view normal = local.normalized;
  const AddedTokenMatcher& added = normalized_added[allow_special];
  if (added.empty()) return encode_pieces(normal, out, local);
  for (std::size_t at = 0; at < normal.size();) {
    const std::optional<AddedTokenMatcher::Found> found = added.find(normal, at);
    const std::size_t stop = found ? found->begin : normal.size();
    encode_pieces(normal.substr(at, stop - at), out, local);
    if (!found) break;
    out.push_back(found->id);
    at = found->end;
  }
}

void TokenizerImpl::encode_pieces(std::string_view text, std::vector<TokenId>& out,
                                  ThreadScratch& local) const {
  if (text.empty()) return;
  local.pieces.assign(1, text);
  local.prefixed.clear();
  for (std::size_t step = 0; step < pipeline.steps.size(); ++step) split_step(step, local);
  for (const std::string_view piece : local.pieces) encode_piece(piece, out, local);
}

// One pre-tokenizer step over every piece, as `tokenizers` splits: the matches and the gaps
// between them, joined or dropped as the behaviour says.
void TokenizerImpl::split_step(std::size_t step, ThreadScratch& local) const {
  const PreTokenizerStep& s = pipeline.steps[step];
  std::vector<std::string_view>& next = local.next_pieces;
  next.clear();
  for (const std::string_view piece : local.pieces) {
    if (!s.pattern) {  // ByteLevel's add_prefix_space
      if (piece.starts_with(' ')) next.push_back(piece);
      else next.push_back(local.prefixed.emplace_back(" " + std::string(piece)));
      continue;
    }
    local.step_splitters[step]->find(piece, local.matches);
    // The pieces of this one, as (begin, end, is a match) in order.
    struct Segment {
      std::size_t begin, end;
      bool match;
    };
    std::vector<Segment> segments;
    std::size_t at = 0;
    for (const MatchSpan& m : local.matches) {
      if (m.begin > at) segments.push_back({at, m.begin, s.invert});
      segments.push_back({m.begin, m.end, !s.invert});
      at = m.end;
    }
    if (at < piece.size()) segments.push_back({at, piece.size(), s.invert});
    std::vector<Segment> kept;
    bool previous_match = false;
    switch (s.behavior) {
      case SplitBehavior::removed:
        for (const Segment& g : segments)
          if (!g.match) kept.push_back(g);
        break;
      case SplitBehavior::isolated:
        kept = segments;
        break;
      case SplitBehavior::contiguous:
        for (const Segment& g : segments) {
          if (!kept.empty() && g.match && previous_match) kept.back().end = g.end;
          else kept.push_back(g);
          previous_match = g.match;
        }
        break;
      case SplitBehavior::merged_with_previous:
        for (const Segment& g : segments) {
          if (g.match && !previous_match && !kept.empty()) kept.back().end = g.end;
          else kept.push_back(g);
          previous_match = g.match;
        }
        break;
      case SplitBehavior::merged_with_next:
        for (auto g = segments.rbegin(); g != segments.rend(); ++g) {
          if (g->match && !previous_match && !kept.empty()) kept.back().begin = g->begin;
          else kept.push_back(*g);
          previous_match = g->match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
    }
    for (const Segment& g : kept) next.push_back(piece.substr(g.begin, g.end - g.begin));
  }
  std::swap(local.pieces, next);
}

}  // namespace detail

Tokenizer::Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}

std::optional<TokenizerFamily> parse_tokenizer_family(std::string_view name) {
  if (name == "gpt2") return TokenizerFamily::gpt2;
  if (name == "llama3") return TokenizerFamily::llama3;
  if (name == "qwen2") return TokenizerFamily::qwen2;
  return std::nullopt;
}

Tokenizer Tokenizer::load(const std::filesystem::path& path, TokenizerFamily family) {
  return Tokenizer(std::make_shared<const detail::TokenizerImpl>(
      detail::read_tokenizer(path, family), path, family));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  encode(text, out);
  return out;
}

void Tokenizer::encode(std::string_view text, std::vector<TokenId>& out) const {
  impl_->encode(text, out, false);
}

std::vector<TokenId> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<TokenId> out;
  impl_->encode(text, out, true);
  return out;
}

void Tokenizer::encode_with_special(std::string_view text, std::vector<TokenId>& out) const {
  impl_->encode(text, out, true);
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

std::optional<TokenId> Tokenizer::end_of_text() const noexcept { return impl_->pipeline.eos; }

std::optional<TokenId> Tokenizer::begin_of_text() const noexcept { return impl_->pipeline.bos; }

std::span<const TokenId> Tokenizer::sequence_prefix() const noexcept {
  return impl_->pipeline.prefix;
}

std::vector<TokenId> Tokenizer::document_start() const {
  const detail::Pipeline& p = impl_->pipeline;
  if (!p.prefix.empty()) return p.prefix;
  if (p.eos) return {*p.eos};
  return {};
}

std::optional<TokenId> Tokenizer::special_token(std::string_view text) const {
  for (const detail::AddedToken& t : impl_->pipeline.added)
    if (t.content == text) return t.id;
  return std::nullopt;
}

TokenizerFamily Tokenizer::family() const noexcept { return impl_->family; }

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
  // What the pipeline does beyond GPT-2's (nothing is added for GPT-2, whose hash stays).
  if (const detail::Pipeline& p = impl_->pipeline; !p.gpt2 || !p.prefix.empty()) {
    h = detail::fnv1a64(p.description.data(), p.description.size(), h);
    for (const detail::AddedToken& t : p.added) {
      feed_u64(t.id);
      h = detail::fnv1a64(t.content.data(), t.content.size(), h);
      feed_u64(t.special | t.lstrip << 1 | t.rstrip << 2 | t.normalized << 3);
    }
    for (const TokenId id : p.prefix) feed_u64(id);
    feed_u64(p.eos ? *p.eos : ~std::uint64_t{0});
  }
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
                           kPathKey = "lockstep.tokenizer.path", kBpe = "bpe",
                           kFamilyKey = "lockstep.tokenizer.family";

std::string_view family_name(TokenizerFamily family) {
  switch (family) {
    case TokenizerFamily::gpt2: return "gpt2";
    case TokenizerFamily::llama3: return "llama3";
    case TokenizerFamily::qwen2: return "qwen2";
    case TokenizerFamily::automatic: break;
  }
  return "";
}
}  // namespace

void record_tokenizer(std::map<std::string, std::string>& metadata, const Tokenizer& tokenizer) {
  metadata[std::string(kKindKey)] = kBpe;
  metadata[std::string(kHashKey)] = tokenizer.content_hash();
  metadata[std::string(kPathKey)] =
      std::filesystem::absolute(tokenizer.source()).lexically_normal().string();
  if (tokenizer.family() != TokenizerFamily::automatic)
    metadata[std::string(kFamilyKey)] = family_name(tokenizer.family());
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
  const auto recorded_family = metadata.find(std::string(kFamilyKey));
  const TokenizerFamily family =
      recorded_family == metadata.end()
          ? TokenizerFamily::automatic
          : parse_tokenizer_family(recorded_family->second).value_or(TokenizerFamily::automatic);
  if (path.empty() && recorded.empty())
    throw InputError(fmt::format("{}: the checkpoint records a tokenizer (hash {}) but not where "
                                 "it is: give {}",
                                 file.string(), hash->second, kOriginalTokenizer));
  if (path.empty() && !std::filesystem::exists(recorded))
    throw InputError(fmt::format("{}: the tokenizer it was trained with, {}, is gone (no such "
                                 "file or directory; content hash {}): give {}",
                                 file.string(), recorded, hash->second, kOriginalTokenizer));
  Tokenizer tokenizer =
      Tokenizer::load(path.empty() ? std::filesystem::path(recorded) : path, family);
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
    tokenizer = Tokenizer::load(path, parse_tokenizer_family(config.data.tokenizer_family)
                                          .value_or(TokenizerFamily::automatic));
  } catch (const InputError& e) {
    const std::string what = e.what();
    throw InputError(fmt::format("data.tokenizer: {}{}", what,
                                 what.find("--tokenizer-family") != std::string::npos
                                     ? " (in a config: data.tokenizer_family)"
                                     : ""));
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
