// Token streams: llm.c .bin and raw uint16 files, UTF-8 text, the windows a language model
// trains on, the tail split, and the sampler's sharding of windows across ranks.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "../text/vocab_files.hpp"
#include "lockstep/tokenizer.hpp"
#include "temp_files.hpp"

using lockstep::InputError;
using lockstep::TokenDataset;
using lockstep::TokenFormat;

namespace {

template <class T>
std::string bytes_of(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// llm.c's .bin: 256 int32 (magic, version, count, zeros), then the tokens.
template <class T>
std::string llmc(const std::vector<T>& tokens, std::int32_t version = sizeof(T) == 2 ? 1 : 2,
                 std::optional<std::int32_t> count = std::nullopt) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = version;
  header[2] = count.value_or(static_cast<std::int32_t>(tokens.size()));
  return bytes_of(header) + bytes_of(tokens);
}

// Tokens 0, 1, ..., n - 1: each window's first input is its start in the stream.
template <class T = std::uint16_t>
std::vector<T> iota_tokens(std::size_t n) {
  std::vector<T> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<T>(i);
  return t;
}

struct Sample {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

Sample sample(const lockstep::Dataset& d, std::size_t i) {
  Sample s{std::vector<float>(static_cast<std::size_t>(d.features())),
           std::vector<std::int32_t>(static_cast<std::size_t>(d.targets()))};
  d.get(i, s.x.data(), s.y.data());
  return s;
}

// The InputError message of `load`, checked to start with `file`.
template <class F>
std::string error_naming(const std::filesystem::path& file, F&& load) {
  try {
    load();
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.rfind(file.string(), 0) == 0, what);
    return what;
  }
  FAIL_CHECK("no InputError for " << file.string());
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("TokenDataset: windows of context + 1 tokens at stride context, targets shifted by one") {
  // 22 tokens, context 4: windows start at 0, 4, 8, 12, 16 and end at 20; token 21 starts no
  // full window and is dropped.
  const TokenDataset d(iota_tokens(22), /*context=*/4, /*vocab_size=*/100);
  CHECK(d.size() == 5);
  CHECK(d.features() == 4);
  CHECK(d.targets() == 4);
  CHECK(d.classes() == 100);
  CHECK(d.token_count() == 22);
  for (std::size_t i = 0; i < d.size(); ++i) {
    const Sample s = sample(d, i);
    for (std::size_t t = 0; t < 4; ++t) {
      CHECK(s.x[t] == static_cast<float>(i * 4 + t));
      CHECK(s.y[t] == static_cast<std::int32_t>(i * 4 + t + 1));
    }
  }
  std::vector<float> x(4);
  std::vector<std::int32_t> y(4);
  CHECK_THROWS_AS(d.get(5, x.data(), y.data()), std::out_of_range);
  CHECK(TokenDataset(iota_tokens(21), 4, 100).size() == 5);  // exactly 5 * 4 + 1
  CHECK(TokenDataset(iota_tokens(5), 4, 100).size() == 1);

  // uint32 ids up to 2^24 - 1 arrive as exact floats.
  const TokenDataset big(std::vector<std::uint32_t>{16777215, 16777214, 3}, 2, 1 << 24);
  const Sample s = sample(big, 0);
  CHECK(s.x[0] == 16777215.0f);
  CHECK(s.x[1] == 16777214.0f);
  CHECK(s.y[0] == 16777214);
  CHECK(s.y[1] == 3);

  CHECK_THROWS_WITH_AS(TokenDataset(iota_tokens(4), 4, 100),
                       "token dataset: 4 tokens: expected at least context + 1 = 5 for one sample",
                       InputError);
  CHECK_THROWS_WITH_AS(TokenDataset(iota_tokens(10), 4, 5),
                       "token dataset: token 5 is 5: expected a token id < vocab_size = 5",
                       InputError);
  CHECK_THROWS_AS(TokenDataset(iota_tokens(10), 0, 100), InputError);
  CHECK_THROWS_AS(TokenDataset(iota_tokens(10), 4, (1 << 24) + 1), InputError);
}

TEST_CASE("load_tokens: llm.c .bin, uint16 (version 1) and uint32 (version 2)") {
  lockstep::test::TempDir dir;
  const auto v1 = dir.write("train.bin", llmc(iota_tokens(21)));
  for (const TokenFormat format : {TokenFormat::automatic, TokenFormat::llmc}) {
    const TokenDataset d = lockstep::load_tokens(v1, format, 4, 50257);
    CHECK(d.token_count() == 21);
    CHECK(d.size() == 5);
    CHECK(sample(d, 4).y.back() == 20);
  }
  const auto v2 =
      dir.write("llama.bin", llmc(std::vector<std::uint32_t>{128000, 5, 70000, 128255, 9}));
  const TokenDataset d = lockstep::load_tokens(v2, TokenFormat::automatic, 2, 128256);
  CHECK(d.size() == 2);
  CHECK(sample(d, 0).x == std::vector<float>{128000, 5});
  CHECK(sample(d, 1).y == std::vector<std::int32_t>{128255, 9});
}

TEST_CASE("load_tokens: headerless raw uint16, as nanoGPT's prepare.py writes") {
  lockstep::test::TempDir dir;
  const auto raw = dir.write("train.raw", bytes_of(iota_tokens(13)));
  for (const TokenFormat format : {TokenFormat::automatic, TokenFormat::raw}) {
    const TokenDataset d = lockstep::load_tokens(raw, format, 3, 65536);
    CHECK(d.token_count() == 13);
    CHECK(d.size() == 4);
    CHECK(sample(d, 1).x == std::vector<float>{3, 4, 5});
  }
  // A raw file forced as llmc is refused with a hint (it is longer than a header).
  const auto long_raw = dir.write("long.raw", bytes_of(iota_tokens(600)));
  CHECK(contains(
      error_naming(long_raw, [&] { lockstep::load_tokens(long_raw, TokenFormat::llmc, 4, 1000); }),
      "byte 0: magic number 65536: expected 20240520 (llm.c .bin); for a headerless "
      "file set data.format: raw"));
}

TEST_CASE("load_tokens: every bad file names itself and what was expected") {
  lockstep::test::TempDir dir;
  const auto load = [](const std::filesystem::path& file,
                       TokenFormat format = TokenFormat::automatic) {
    return [=] { lockstep::load_tokens(file, format, 4, 1000); };
  };
  const auto message = [&](const std::string& name, const std::string& bytes,
                           TokenFormat format = TokenFormat::automatic) {
    const auto file = dir.write(name, bytes);
    return error_naming(file, load(file, format));
  };
  const auto header = llmc(iota_tokens(10));

  CHECK(contains(message("short.bin", header.substr(0, 100)),
                 ": truncated header: expected 1024 bytes (256 int32) for an llm.c .bin header, "
                 "file has 100"));
  CHECK(contains(message("truncated.bin", header.substr(0, header.size() - 3)),
                 ": the header says 10 tokens of 2 bytes (20 bytes after the 1024-byte header), "
                 "the file has 17 (truncated)"));
  CHECK(contains(message("extra.bin", header + "xx"),
                 ": the header says 10 tokens of 2 bytes (20 bytes after the 1024-byte header), "
                 "the file has 22"));
  CHECK(contains(message("version.bin", llmc(iota_tokens(10), 3)),
                 ": byte 4: version 3: expected 1 (uint16 tokens) or 2 (uint32 tokens)"));
  CHECK(contains(message("negative.bin", llmc(iota_tokens(10), 1, -5)),
                 ": byte 8: token count -5: expected a count >= 0"));
  CHECK(contains(message("count.bin", llmc(iota_tokens(10), 1, 2147483647)),
                 ": the header says 2147483647 tokens"));
  // Token 7 is 1000 in a vocabulary of 1000: byte 1024 + 7 * 2 = 1038.
  std::vector<std::uint16_t> bad = iota_tokens(10);
  bad[7] = 1000;
  CHECK(contains(message("vocab.bin", llmc(bad)),
                 ": byte 1038: token 7 is 1000: expected a token id < model.vocab_size = 1000"));
  CHECK(contains(message("vocab.raw", bytes_of(bad)),
                 ": byte 14: token 7 is 1000: expected a token id < model.vocab_size = 1000"));
  CHECK(contains(message("odd.raw", bytes_of(iota_tokens(10)) + "x"),
                 ": 21 bytes: expected an even size for raw uint16 tokens"));
  CHECK(contains(message("few.raw", bytes_of(iota_tokens(4))),
                 ": 4 tokens: expected at least context + 1 = 5 for one sample"));
  CHECK(contains(message("few.bin", llmc(iota_tokens(4))),
                 ": 4 tokens: expected at least context + 1 = 5 for one sample"));
  CHECK(contains(message("empty.bin", ""), ": empty file: expected tokens"));
  const auto missing = dir.path() / "missing.bin";
  CHECK(contains(error_naming(missing, load(missing)), ": cannot open: No such file"));
}

// Note [Almost an llm.c header]: format auto does not read a damaged header as raw tokens.
TEST_CASE("load_tokens: under format auto, an almost-llm.c header is an error, not raw tokens") {
  lockstep::test::TempDir dir;
  const auto with_magic = [](std::string bytes, std::int32_t magic) {
    std::memcpy(bytes.data(), &magic, sizeof magic);
    return bytes;
  };
  const std::string good = llmc(iota_tokens(10));
  // One bit and four bits off llm.c's magic: a damaged magic, refused under auto.
  const auto one_bit = dir.write("one_bit.bin", with_magic(good, 20240520 ^ 0x40));
  CHECK(contains(error_naming(one_bit, [&] {
                   lockstep::load_tokens(one_bit, TokenFormat::automatic, 4, 1000);
                 }),
                 ": byte 0: magic number 20240584 is 1 bit(s) away from llm.c's 20240520: a "
                 "damaged llm.c .bin file? data.format auto refuses to read it as raw tokens; set "
                 "data.format: llmc or raw to say which it is"));
  const auto four_bits = dir.write("four_bits.bin", with_magic(good, 20240520 ^ 0x0F000000));
  CHECK(contains(error_naming(four_bits, [&] {
                   lockstep::load_tokens(four_bits, TokenFormat::automatic, 4, 1000);
                 }),
                 "is 4 bit(s) away from llm.c's 20240520"));
  // A magic far from llm.c's, but version 1 and a count that matches the size exactly.
  const auto wrong = dir.write("wrong_magic.bin", with_magic(good, 12345));
  CHECK(contains(error_naming(wrong, [&] {
                   lockstep::load_tokens(wrong, TokenFormat::automatic, 4, 1000);
                 }),
                 ": byte 0: magic number 12345 with an llm.c header after it (version 1, 10 "
                 "tokens, matching the file's size): expected llm.c's magic 20240520"));
  // The same bytes are readable when the format is said: as raw tokens (the header's int32
  // halves are tokens; 12345 is out of a vocabulary of 1000, so use a larger one).
  CHECK(lockstep::load_tokens(wrong, TokenFormat::raw, 4, 65536).token_count() == 522);
  // Raw tokens whose first int32 (65536) is 11 bits off, with no header after it: raw, as before.
  const auto raw = dir.write("raw.bin", bytes_of(iota_tokens(600)));
  CHECK(lockstep::load_tokens(raw, TokenFormat::automatic, 4, 1000).token_count() == 600);
}

TEST_CASE("load_text: bytes are tokens, multibyte UTF-8 is accepted, invalid UTF-8 is named") {
  lockstep::test::TempDir dir;
  const std::string text = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac \xf0\x9f\x98\x80\n";
  const auto file = dir.write("utf8.txt", text);
  const TokenDataset d = lockstep::load_text(file, 4);
  CHECK(d.classes() == 256);
  CHECK(d.token_count() == text.size());
  CHECK(d.size() == (text.size() - 1) / 4);
  const Sample first = sample(d, 0);
  CHECK(first.x == std::vector<float>{'h', 0xc3, 0xa9, 'l'});
  CHECK(first.y == std::vector<std::int32_t>{0xc3, 0xa9, 'l', 'l'});
  CHECK(lockstep::load_text(file, 4, 300).classes() == 300);

  const auto bad = [&](const std::string& name, const std::string& bytes) {
    const auto f = dir.write(name, bytes);
    return error_naming(f, [&] { lockstep::load_text(f, 2); });
  };
  CHECK(contains(bad("latin1.txt", "line one\nline tw\xf6\n"),
                 ":2: byte 16 (column 8): invalid UTF-8 sequence starting f6 0a: expected UTF-8 "
                 "text"));
  CHECK(contains(bad("overlong.txt", "ab\xc0\x80"), ":1: byte 2 (column 3)"));
  CHECK(contains(bad("surrogate.txt", "a\n\nb\xed\xa0\x80"), ":3: byte 4 (column 2)"));
  CHECK(contains(bad("truncated.txt", "abc\xe2\x82"), ":1: byte 3 (column 4)"));
  CHECK(contains(bad("too_big.txt", "abc\xf4\x90\x80\x80"), ":1: byte 3"));
  CHECK(contains(bad("lone.txt", "abc\x80xyz"), ":1: byte 3"));
  CHECK(contains(bad("empty.txt", ""), ": empty file: expected UTF-8 text"));
  CHECK(contains(bad("short.txt", "ab"), ": 2 tokens: expected at least context + 1 = 3"));
  const auto small_vocab = dir.write("ok.txt", "hello");
  CHECK(contains(error_naming(small_vocab, [&] { lockstep::load_text(small_vocab, 2, 255); }),
                 ": vocab_size 255: expected at least 256 for text"));
}

TEST_CASE("split_tokens: the eval split is the tail of the stream, windowed the same way") {
  // 101 tokens, eval_fraction 0.2: the last round(20.2) = 20 tokens are eval.
  const TokenDataset all(iota_tokens(101), 4, 1000);
  const lockstep::DataSplit split = lockstep::split_tokens(all, 0.2);
  CHECK(split.train->size() == 20);  // (81 - 1) / 4
  CHECK(split.eval->size() == 4);    // (20 - 1) / 4
  // The last train target is token 80; the first eval input is token 81: no overlap.
  CHECK(sample(*split.train, 19).y.back() == 80);
  CHECK(sample(*split.eval, 0).x.front() == 81.0f);
  CHECK(sample(*split.eval, 3).y.back() == 97);
  CHECK(split.eval->targets() == 4);

  const lockstep::DataSplit none = lockstep::split_tokens(all, 0.0);
  CHECK(none.train->size() == 25);
  CHECK(none.eval->size() == 0);
  CHECK_THROWS_WITH_AS(lockstep::split_tokens(all, 0.03),
                       "data too small: eval_fraction 0.03 of 101 tokens holds out 3: expected at "
                       "least context + 1 = 5 (or eval_fraction 0)",
                       InputError);
  CHECK_THROWS_WITH_AS(lockstep::split_tokens(TokenDataset(iota_tokens(8), 4, 1000), 0.5),
                       "data too small: 8 tokens with eval_fraction 0.5 leave 4 for training: "
                       "expected at least context + 1 = 5",
                       InputError);
  CHECK_THROWS_AS(lockstep::split_tokens(all, 1.0), InputError);
  CHECK_THROWS_AS(all.slice(5, 102), std::out_of_range);
  CHECK(all.slice(10, 15).size() == 1);
  CHECK(sample(all.slice(10, 15), 0).x.front() == 10.0f);
}

TEST_CASE("load_dataset: tokens and text, with and without eval_path, never normalised") {
  lockstep::test::TempDir dir;
  dir.write("train.bin", llmc(iota_tokens(101)));
  dir.write("val.raw", bytes_of(iota_tokens(9)));
  lockstep::Config cfg;
  cfg.model.type = "gpt";
  cfg.model.context = 4;
  cfg.model.vocab_size = 1000;
  cfg.data.dataset = lockstep::DatasetKind::tokens;
  cfg.data.path = "train.bin";
  cfg.data.normalize = true;  // ignored: ids are not features
  cfg.data.eval_fraction = 0.2;
  const lockstep::DataSplit tail = lockstep::load_dataset(cfg, dir.path());
  CHECK(tail.train->size() == 20);
  CHECK(tail.eval->size() == 4);
  CHECK(sample(*tail.train, 1).x == std::vector<float>{4, 5, 6, 7});

  cfg.data.eval_path = "val.raw";
  const lockstep::DataSplit separate = lockstep::load_dataset(cfg, dir.path());
  CHECK(separate.train->size() == 25);  // the whole train file
  CHECK(separate.eval->size() == 2);    // (9 - 1) / 4
  CHECK(sample(*separate.eval, 1).y == std::vector<std::int32_t>{5, 6, 7, 8});

  cfg.model.vocab_size = 0;
  CHECK_THROWS_AS(lockstep::load_dataset(cfg, dir.path()), InputError);

  dir.write("book.txt", "To be, or not to be, that is the question.\n");
  lockstep::Config text;
  text.model.type = "gpt";
  text.model.context = 8;
  text.data.dataset = lockstep::DatasetKind::text;
  text.data.path = "book.txt";
  text.data.eval_fraction = 0.0;
  const lockstep::DataSplit t = lockstep::load_dataset(text, dir.path());
  CHECK(t.train->classes() == 256);  // vocab_size 0: bytes
  CHECK(t.train->size() == 5);       // (43 - 1) / 8
  CHECK(sample(*t.train, 0).x[0] == static_cast<float>('T'));
  text.data.path = "";
  CHECK_THROWS_WITH_AS(lockstep::load_dataset(text),
                       "data.path: expected the file of a tokens or text dataset, got ''",
                       InputError);
}

TEST_CASE("load_dataset: text through data.tokenizer, as lockstep tokenize writes a document") {
  lockstep::test::TempDir dir;
  const std::string book = "To be, or not to be, that is the question: abcd the thee\n";
  dir.write("book.txt", book);
  dir.write("bpe.tiktoken", lockstep::test::rank_file(lockstep::test::hand_vocab()));
  const lockstep::Tokenizer tokenizer = lockstep::Tokenizer::load(dir.path() / "bpe.tiktoken");
  std::vector<lockstep::TokenId> ids{*tokenizer.end_of_text()};
  tokenizer.encode(book, ids);
  REQUIRE(ids.size() < book.size());  // the merges fired

  lockstep::Config cfg;
  cfg.model.type = "gpt";
  cfg.model.context = 4;
  cfg.data.dataset = lockstep::DatasetKind::text;
  cfg.data.path = "book.txt";
  cfg.data.tokenizer = "bpe.tiktoken";
  cfg.data.eval_fraction = 0.0;
  const lockstep::DataSplit split = lockstep::load_dataset(cfg, dir.path());
  CHECK(split.train->classes() == static_cast<int>(tokenizer.vocab_size()));  // vocab_size 0
  REQUIRE(split.train->size() == (ids.size() - 1) / 4);
  for (std::size_t w = 0; w < split.train->size(); ++w)
    for (std::size_t i = 0; i < 4; ++i)
      CHECK(sample(*split.train, w).x[i] == static_cast<float>(ids[w * 4 + i]));

  cfg.model.vocab_size = 300;  // a padded vocabulary holds it
  CHECK(lockstep::load_dataset(cfg, dir.path()).train->classes() == 300);
  cfg.model.vocab_size = 260;
  CHECK_THROWS_WITH_AS(lockstep::load_dataset(cfg, dir.path()),
                       doctest::Contains("has 266 ids, more than model.vocab_size 260"), InputError);
  cfg.data.tokenizer = "none.tiktoken";
  CHECK_THROWS_WITH_AS(lockstep::load_dataset(cfg, dir.path()),
                       doctest::Contains("data.tokenizer: "), InputError);
}

TEST_CASE("DistributedSampler over token windows: disjoint across ranks, union is every window") {
  constexpr std::size_t kContext = 8, kWindows = 48;
  const TokenDataset d(iota_tokens(kWindows * kContext + 1), kContext, 1000);
  REQUIRE(d.size() == kWindows);
  for (const int ranks : {1, 2, 3, 4, 6}) {
    for (const std::uint64_t epoch : {0, 1}) {
      CAPTURE(ranks);
      CAPTURE(epoch);
      std::set<std::size_t> starts;
      std::size_t total = 0;
      for (int r = 0; r < ranks; ++r) {
        lockstep::DistributedSampler sampler(d.size(), ranks, r, /*shuffle=*/true, /*seed=*/7,
                                             /*drop_last=*/false);
        sampler.set_epoch(epoch);
        const auto indices = sampler.indices();
        CHECK(indices.size() == kWindows / static_cast<std::size_t>(ranks));
        for (const std::size_t i : indices) {
          const Sample s = sample(d, i);
          starts.insert(static_cast<std::size_t>(s.x[0]));
          CHECK(s.y[kContext - 1] == static_cast<std::int32_t>(s.x[0]) + kContext);
        }
        total += indices.size();
      }
      // Every window exactly once: as many distinct windows as samples drawn, all of them.
      CHECK(total == kWindows);
      CHECK(starts.size() == kWindows);
      std::set<std::size_t> expected;
      for (std::size_t k = 0; k < kWindows; ++k) expected.insert(k * kContext);
      CHECK(starts == expected);
    }
  }
  // Each epoch reshuffles the windows.
  lockstep::DistributedSampler a(d.size(), 2, 0, true, 7, false), b = a;
  b.set_epoch(1);
  CHECK(a.indices() != b.indices());
}
