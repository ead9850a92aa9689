// TokenDataset, the token-file and text readers, and the tail split of a token stream.
//
// Every file is read whole and checked before a dataset is built from it: the header, the size
// the header promises, and every token against the vocabulary. Messages name the file and the
// byte offset (or, for text, the line) of the first problem.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "data/too_few_tokens.hpp"
#include "io/open_input.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"

namespace lockstep {

namespace {

// llm.c's .bin header (dev/data/data_common.py): 256 int32, then the tokens.
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderInts = 256;
constexpr std::size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(std::int32_t);
constexpr std::int32_t kLlmcUint16 = 1;  // GPT-2 tokens
constexpr std::int32_t kLlmcUint32 = 2;  // Llama 3 tokens

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and copied as they are");

std::int32_t read_le32(std::string_view bytes, std::size_t offset) {
  std::int32_t v = 0;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

void check_shape(int context, int vocab_size, std::string_view who) {
  if (context < 1)
    throw InputError(fmt::format("{}: context: expected an integer >= 1, got {}", who, context));
  if (vocab_size < 1 || vocab_size > kMaxVocabSize)
    throw InputError(fmt::format("{}: vocab_size: expected an integer in [1, {}], got {}", who,
                                 kMaxVocabSize, vocab_size));
}

void check_window(std::size_t tokens, int context, std::string_view who) {
  if (tokens < static_cast<std::size_t>(context) + 1)
    throw detail::TooFewTokens(fmt::format("{}: {} tokens: expected at least context + 1 = {} for one sample",
                                 who, tokens, static_cast<std::size_t>(context) + 1));
}

// The first token >= vocab_size, or tokens.size().
template <class T>
std::size_t first_out_of_vocab(std::span<const T> tokens, int vocab_size) {
  const auto limit = static_cast<std::uint64_t>(vocab_size);
  const auto it = std::find_if(tokens.begin(), tokens.end(),
                               [&](T t) { return static_cast<std::uint64_t>(t) >= limit; });
  return static_cast<std::size_t>(it - tokens.begin());
}

// Copies the little-endian T at bytes[offset..] into a vector.
template <class T>
std::vector<T> decode(std::string_view bytes, std::size_t offset, std::size_t count) {
  std::vector<T> tokens(count);
  // An empty vector's data() may be null, which memcpy may not be given even for 0 bytes.
  if (count > 0) std::memcpy(tokens.data(), bytes.data() + offset, count * sizeof(T));
  return tokens;
}

// Checks the vocabulary with the file's name and byte offsets, then builds the dataset.
template <class T>
TokenDataset checked(const std::string& name, std::vector<T> tokens, std::size_t payload_offset,
                     int context, int vocab_size) {
  check_shape(context, vocab_size, name);
  const std::size_t bad = first_out_of_vocab(std::span<const T>(tokens), vocab_size);
  if (bad < tokens.size())
    throw InputError(
        fmt::format("{}: byte {}: token {} is {}: expected a token id < model.vocab_size = {}",
                    name, payload_offset + bad * sizeof(T), bad,
                    static_cast<std::uint64_t>(tokens[bad]), vocab_size));
  check_window(tokens.size(), context, name);
  return TokenDataset(std::move(tokens), context, vocab_size);
}

TokenDataset read_llmc(const std::string& name, std::string_view bytes, int context,
                       int vocab_size) {
  if (bytes.size() < kLlmcHeaderBytes)
    throw InputError(fmt::format(
        "{}: truncated header: expected {} bytes (256 int32) for an llm.c .bin header, file has {}",
        name, kLlmcHeaderBytes, bytes.size()));
  const std::int32_t magic = read_le32(bytes, 0);
  if (magic != kLlmcMagic)
    throw InputError(fmt::format(
        "{}: byte 0: magic number {}: expected {} (llm.c .bin); for a headerless file set "
        "data.format: raw",
        name, magic, kLlmcMagic));
  const std::int32_t version = read_le32(bytes, 4);
  if (version != kLlmcUint16 && version != kLlmcUint32)
    throw InputError(
        fmt::format("{}: byte 4: version {}: expected {} (uint16 tokens) or {} (uint32 tokens)",
                    name, version, kLlmcUint16, kLlmcUint32));
  const std::int32_t count = read_le32(bytes, 8);
  if (count < 0)
    throw InputError(fmt::format("{}: byte 8: token count {}: expected a count >= 0", name, count));
  const std::size_t width = version == kLlmcUint16 ? 2 : 4;
  const std::size_t payload = bytes.size() - kLlmcHeaderBytes;
  const auto expected = static_cast<std::size_t>(count) * width;
  if (payload != expected)
    throw InputError(fmt::format(
        "{}: the header says {} tokens of {} bytes ({} bytes after the {}-byte header), the file "
        "has {}{}",
        name, count, width, expected, kLlmcHeaderBytes, payload,
        payload < expected ? " (truncated)" : ""));
  if (width == 2)
    return checked(name, decode<std::uint16_t>(bytes, kLlmcHeaderBytes, payload / 2),
                   kLlmcHeaderBytes, context, vocab_size);
  return checked(name, decode<std::uint32_t>(bytes, kLlmcHeaderBytes, payload / 4),
                 kLlmcHeaderBytes, context, vocab_size);
}

// Note [Almost an llm.c header]
// Under data.format auto, a file whose first int32 is not llm.c's magic is read as raw uint16
// tokens, header and all. A damaged llm.c file would then train on 512 tokens of header
// without a word. So auto refuses what is almost a header: a magic a few bits from llm.c's, or
// a plausible header (version 1 or 2, and a token count that matches the file's size exactly)
// under another magic. Raw tokens that happen to look like that are read with data.format: raw.
constexpr int kNearMagicBits = 4;

// Why `bytes` look like a damaged llm.c header, or "" when they do not.
std::string almost_llmc(std::string_view bytes) {
  if (bytes.size() < 4) return "";
  const std::int32_t magic = read_le32(bytes, 0);
  const int bits = std::popcount(static_cast<std::uint32_t>(magic ^ kLlmcMagic));
  if (bits <= kNearMagicBits)
    return fmt::format("magic number {} is {} bit(s) away from llm.c's {}", magic, bits,
                       kLlmcMagic);
  if (bytes.size() < kLlmcHeaderBytes) return "";
  const std::int32_t version = read_le32(bytes, 4), count = read_le32(bytes, 8);
  if ((version != kLlmcUint16 && version != kLlmcUint32) || count < 0) return "";
  const std::size_t width = version == kLlmcUint16 ? 2 : 4;
  if (static_cast<std::size_t>(count) * width != bytes.size() - kLlmcHeaderBytes) return "";
  return fmt::format(
      "magic number {} with an llm.c header after it (version {}, {} tokens, matching the file's "
      "size): expected llm.c's magic {}",
      magic, version, count, kLlmcMagic);
}

TokenDataset read_raw(const std::string& name, std::string_view bytes, int context,
                      int vocab_size) {
  if (bytes.size() % 2 != 0)
    throw InputError(
        fmt::format("{}: {} bytes: expected an even size for raw uint16 tokens (a truncated file?)",
                    name, bytes.size()));
  return checked(name, decode<std::uint16_t>(bytes, 0, bytes.size() / 2), 0, context, vocab_size);
}

// The length of the valid UTF-8 sequence at bytes[i], or 0 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF).
std::size_t utf8_sequence(std::string_view bytes, std::size_t i) {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(bytes[k]); };
  const unsigned char b0 = at(i);
  if (b0 < 0x80) return 1;
  std::size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > bytes.size()) return 0;
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < length; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
  return length;
}

void check_utf8(const std::string& name, std::string_view bytes) {
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t length = utf8_sequence(bytes, i);
    if (length == 0) {
      const std::size_t shown = std::min<std::size_t>(4, bytes.size() - i);
      std::string hex;
      for (std::size_t k = 0; k < shown; ++k)
        hex += fmt::format("{}{:02x}", k ? " " : "", static_cast<unsigned char>(bytes[i + k]));
      throw InputError(fmt::format(
          "{}:{}: byte {} (column {}): invalid UTF-8 sequence starting {}: expected UTF-8 text",
          name, line, i, i - line_start + 1, hex));
    }
    if (bytes[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
    i += length;
  }
}

}  // namespace

// ---- TokenDataset ---------------------------------------------------------------------------

namespace {

// A dataset owning `tokens`.
template <typename T>
TokenDataset owning(std::vector<T> tokens, int context, int vocab_size) {
  auto owned = std::make_shared<const std::vector<T>>(std::move(tokens));
  return TokenDataset(std::span<const T>(*owned), owned, context, vocab_size);
}

}  // namespace

TokenDataset::TokenDataset(std::vector<std::uint16_t> tokens, int context, int vocab_size)
    : TokenDataset(owning(std::move(tokens), context, vocab_size)) {}

TokenDataset::TokenDataset(std::vector<std::uint32_t> tokens, int context, int vocab_size)
    : TokenDataset(owning(std::move(tokens), context, vocab_size)) {}

TokenDataset::TokenDataset(std::span<const std::uint16_t> tokens,
                           std::shared_ptr<const void> owner, int context, int vocab_size)
    : TokenDataset(Tokens(tokens), std::move(owner), context, vocab_size) {}

TokenDataset::TokenDataset(std::span<const std::uint32_t> tokens,
                           std::shared_ptr<const void> owner, int context, int vocab_size)
    : TokenDataset(Tokens(tokens), std::move(owner), context, vocab_size) {}

TokenDataset::TokenDataset(Tokens tokens, std::shared_ptr<const void> owner, int context,
                           int vocab_size)
    : owner_(std::move(owner)),
      tokens_(tokens),
      begin_(0),
      end_(std::visit([](const auto& all) { return all.size(); }, tokens_)),
      context_(context),
      vocab_size_(vocab_size) {
  constexpr std::string_view kWho = "token dataset";
  check_shape(context_, vocab_size_, kWho);
  std::visit(
      [&](const auto& all) {
        const std::size_t bad = first_out_of_vocab(all, vocab_size_);
        if (bad < all.size())
          throw InputError(fmt::format("{}: token {} is {}: expected a token id < vocab_size = {}",
                                       kWho, bad, static_cast<std::uint64_t>(all[bad]),
                                       vocab_size_));
      },
      tokens_);
  check_window(end_, context_, kWho);
}

std::size_t TokenDataset::size() const noexcept {
  const std::size_t n = end_ - begin_;
  return n > static_cast<std::size_t>(context_) ? (n - 1) / static_cast<std::size_t>(context_) : 0;
}

void TokenDataset::get(std::size_t i, float* x, std::int32_t* y) const {
  if (i >= size())
    throw std::out_of_range(fmt::format("token dataset: sample {} of {}", i, size()));
  const auto t = static_cast<std::size_t>(context_);
  std::visit(
      [&](const auto& all) {
        const auto* window = all.data() + begin_ + i * t;
        for (std::size_t k = 0; k < t; ++k) {
          x[k] = static_cast<float>(window[k]);
          y[k] = static_cast<std::int32_t>(window[k + 1]);
        }
      },
      tokens_);
}

TokenDataset TokenDataset::slice(std::size_t begin, std::size_t end) const {
  if (begin > end || end > token_count())
    throw std::out_of_range(
        fmt::format("token dataset: slice [{}, {}) of {} tokens", begin, end, token_count()));
  TokenDataset out = *this;
  out.begin_ = begin_ + begin;
  out.end_ = begin_ + end;
  return out;
}

// ---- Readers --------------------------------------------------------------------------------

TokenDataset load_tokens(const std::filesystem::path& file, TokenFormat format, int context,
                         int vocab_size) {
  const std::string name = file.string();
  const std::string bytes = detail::read_input(file, detail::InputKind::data);
  if (bytes.empty()) throw InputError(fmt::format("{}: empty file: expected tokens", name));
  if (format == TokenFormat::automatic) {
    format = bytes.size() >= 4 && read_le32(bytes, 0) == kLlmcMagic ? TokenFormat::llmc
                                                                    : TokenFormat::raw;
    // Note [Almost an llm.c header]
    if (const std::string why = format == TokenFormat::raw ? almost_llmc(bytes) : "";
        !why.empty())
      throw InputError(fmt::format(
          "{}: byte 0: {}: a damaged llm.c .bin file? data.format auto refuses to read it as raw "
          "tokens; set data.format: llmc or raw to say which it is",
          name, why));
  }
  if (format == TokenFormat::llmc) return read_llmc(name, bytes, context, vocab_size);
  return read_raw(name, bytes, context, vocab_size);
}

TokenDataset load_text(const std::filesystem::path& file, int context, int vocab_size) {
  const std::string name = file.string();
  if (vocab_size < kByteVocabSize)
    throw InputError(
        fmt::format("{}: vocab_size {}: expected at least {} for text (one token per byte)",
                    name, vocab_size, kByteVocabSize));
  const std::string bytes = detail::read_input(file, detail::InputKind::data);
  if (bytes.empty()) throw InputError(fmt::format("{}: empty file: expected UTF-8 text", name));
  check_utf8(name, bytes);
  std::vector<std::uint16_t> tokens(bytes.size());
  std::transform(bytes.begin(), bytes.end(), tokens.begin(),
                 [](char b) { return static_cast<std::uint16_t>(static_cast<unsigned char>(b)); });
  return checked(name, std::move(tokens), 0, context, vocab_size);
}

TokenDataset load_text(const std::filesystem::path& file, int context, int vocab_size,
                       const Tokenizer& tokenizer) {
  const std::string name = file.string();
  if (tokenizer.vocab_size() > static_cast<std::size_t>(vocab_size))
    throw InputError(fmt::format("{}: vocab_size {}: the tokenizer {} has {} ids", name,
                                 vocab_size, tokenizer.source().string(), tokenizer.vocab_size()));
  const std::string bytes = detail::read_input(file, detail::InputKind::data);
  if (bytes.empty()) throw InputError(fmt::format("{}: empty file: expected text", name));
  std::vector<TokenId> ids = tokenizer.document_start();  // as `lockstep tokenize` writes it
  tokenizer.encode(bytes, ids);
  if (vocab_size <= 65536) {
    std::vector<std::uint16_t> narrow(ids.begin(), ids.end());
    return checked(name, std::move(narrow), 0, context, vocab_size);
  }
  return checked(name, std::move(ids), 0, context, vocab_size);
}

// ---- The split ------------------------------------------------------------------------------

DataSplit split_tokens(const TokenDataset& all, double eval_fraction) {
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    throw InputError(
        fmt::format("eval_fraction: expected a value in [0, 1), got {}", eval_fraction));
  const std::size_t n = all.token_count();
  const auto n_eval =
      static_cast<std::size_t>(std::llround(eval_fraction * static_cast<double>(n)));
  const std::size_t need = static_cast<std::size_t>(all.features()) + 1;
  if (n - std::min(n, n_eval) < need)
    throw InputError(fmt::format(
        "data too small: {} tokens with eval_fraction {} leave {} for training: expected at "
        "least context + 1 = {}",
        n, eval_fraction, n - std::min(n, n_eval), need));
  if (n_eval > 0 && n_eval < need)
    throw InputError(
        fmt::format("data too small: eval_fraction {} of {} tokens holds out {}: expected at least "
                    "context + 1 = {} (or eval_fraction 0)",
                    eval_fraction, n, n_eval, need));
  return {std::make_shared<const TokenDataset>(all.slice(0, n - n_eval)),
          std::make_shared<const TokenDataset>(all.slice(n - n_eval, n))};
}

}  // namespace lockstep
