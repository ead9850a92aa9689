// tokenize_files: the safe cuts of long documents, the token files it writes (read back by the
// trainer's reader), the eval split, and what an error or a stop leaves behind (nothing).
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/tokenize_files.hpp"
#include "text/tokenizer_impl.hpp"
#include "vocab_files.hpp"

namespace fs = std::filesystem;
using lockstep::TokenId;
using lockstep::Tokenizer;
using lockstep::test::pieces;
using lockstep::test::TempDir;

namespace {

// Text with every kind of boundary the cuts look at: words, numbers, punctuation, runs of
// spaces and newlines, CRLF, contractions, non-ASCII letters and spaces, invalid bytes.
// `invalid` adds a byte that starts no UTF-8 sequence.
std::string mixed_text(std::mt19937& rng, std::size_t size, bool invalid = true) {
  static const std::vector<std::string> kParts = {
      "the", "The", " ", "  ", "\n", "\n\n", "\r\n", "\t", "'s", "'S", "42", ".", "!", "?\"",
      "caf\xc3\xa9", "\xe2\x80\x83", "\xc2\xa0", "\xe4\xb8\xad", "x", " y", "-", "'", "\xff"};
  std::string out;
  while (out.size() < size) out += kParts[rng() % (kParts.size() - (invalid ? 0 : 1))];
  return out;
}

// A tokenizer (rank file) in `dir`.
Tokenizer small_tokenizer(const TempDir& dir, int merges = 400) {
  return Tokenizer::load(dir.write("small.tiktoken",
                                   lockstep::test::rank_file(lockstep::test::random_vocab(merges, 5))));
}

std::vector<TokenId> document_ids(const Tokenizer& t, std::string_view text) {
  std::vector<TokenId> ids{*t.end_of_text()};
  t.encode(text, ids);
  return ids;
}

std::string jsonl_line(std::string_view text) {
  std::string out = "{\"id\": 1, \"text\": \"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(c));
    else out += c;
  }
  return out + "\"}\n";
}

// Checks, on 200 random texts (with invalid bytes when `invalid`), that every cut `rule` allows
// leaves the pieces `split` makes of the text as they were; returns how many cuts it checked.
template <class Split>
int check_cuts(std::mt19937& rng, bool invalid, lockstep::detail::CutRule rule, Split split) {
  int cuts = 0;
  for (int round = 0; round < 200; ++round) {
    const std::string text = mixed_text(rng, 300, invalid);
    const std::vector<std::string> whole = split(text);
    for (std::size_t p = lockstep::detail::safe_cut(text, 0, rule); p != std::string_view::npos;
         p = lockstep::detail::safe_cut(text, p + 1, rule)) {
      CAPTURE(text.substr(0, p));
      std::vector<std::string> joined = split(std::string_view(text).substr(0, p));
      const std::vector<std::string> after = split(std::string_view(text).substr(p));
      joined.insert(joined.end(), after.begin(), after.end());
      REQUIRE(joined == whole);
      ++cuts;
    }
  }
  return cuts;
}

}  // namespace

TEST_CASE("tokenize_files: a safe cut leaves the pre-tokens as they were") {
  std::mt19937 rng(1);
  CHECK(check_cuts(rng, true, lockstep::detail::CutRule::gpt2, pieces) > 1000);
  // Where a cut would change them: inside a run of spaces, between CR and LF's neighbours.
  CHECK(lockstep::detail::safe_cut("a  b", 0) == std::string_view::npos);
  CHECK(lockstep::detail::safe_cut("a\r\nb", 0) == std::string_view::npos);
  CHECK(lockstep::detail::safe_cut("a\nb", 0) == 2);
  CHECK(lockstep::detail::safe_cut("a. b", 0) == 2);
}

TEST_CASE("tokenize_files: Llama 3's and Qwen2's pieces break in \"a\\nb\", and long documents are cut there") {
  const TempDir dir;
  const std::string ranks = lockstep::test::rank_file(lockstep::test::random_vocab(400, 5));
  for (const auto family : {lockstep::TokenizerFamily::llama3, lockstep::TokenizerFamily::qwen2}) {
    const Tokenizer t = Tokenizer::load(dir.write("small.model", ranks), family);
    REQUIRE(t.impl().pipeline.cut == lockstep::detail::CutRule::newline_between_letters);
    lockstep::detail::PieceSplitter splitter(*t.impl().pipeline.steps.at(0).pattern);
    const auto split = [&](std::string_view text) {
      std::vector<lockstep::detail::MatchSpan> spans;
      splitter.find(text, spans);
      std::vector<std::string> out;
      for (const auto& m : spans) out.emplace_back(text.substr(m.begin, m.end - m.begin));
      return out;
    };
    std::mt19937 rng(3);
    CHECK(check_cuts(rng, false, lockstep::detail::CutRule::newline_between_letters, split) > 50);
    CHECK(lockstep::detail::safe_cut(".\nb", 0, lockstep::detail::CutRule::newline_between_letters) ==
          std::string_view::npos);  // ".\n" is one of their pieces
    // A long document in parts: the ids of the whole, after the family's document start.
    std::string doc;
    while (doc.size() < 100'000) doc += mixed_text(rng, 200) + "a\nb";
    lockstep::TokenizeOptions opt;
    opt.inputs = {dir.write("doc.txt", doc)};
    opt.out = dir.path() / "out.bin";
    lockstep::tokenize_files(t, opt);
    std::vector<TokenId> expected = t.document_start();
    t.encode(doc, expected);
    CHECK(lockstep::test::read_llmc(opt.out) == expected);
    CHECK(expected.front() == (family == lockstep::TokenizerFamily::llama3
                                   ? *t.special_token("<|begin_of_text|>")
                                   : *t.special_token("<|endoftext|>")));
  }
}

TEST_CASE("tokenize_files: a stretch with no safe cut is cut at kMaxStretchBytes, at a character") {
  using lockstep::detail::kMaxStretchBytes;
  using lockstep::detail::part_cut;
  constexpr auto npos = std::string_view::npos;
  constexpr auto gpt2 = lockstep::detail::CutRule::gpt2;
  std::string letters(kMaxStretchBytes + 2, 'a');
  for (std::size_t i = 0; i < letters.size(); i += 3) letters[i] = "bcde"[i % 4];
  const std::string_view view = letters;
  // Whether a safe cut lies at kMaxStretchBytes needs the byte after it: one byte short, npos.
  CHECK(part_cut(view.substr(0, kMaxStretchBytes + 1), lockstep::detail::kPartBytes, gpt2) == npos);
  CHECK(part_cut(view, lockstep::detail::kPartBytes, gpt2) == kMaxStretchBytes);
  // A safe cut within the stretch wins; one past it does not.
  std::string with_cut = letters;
  with_cut.replace(500'000, 3, "x\nA");
  CHECK(part_cut(with_cut, lockstep::detail::kPartBytes, gpt2) == 500'002);
  with_cut = letters + "x\nA";
  CHECK(part_cut(with_cut, lockstep::detail::kPartBytes, gpt2) == kMaxStretchBytes);
  // A 3-byte character across the limit: the cut moves back to its first byte.
  std::string cjk = letters;
  cjk.replace(kMaxStretchBytes - 1, 3, "\xe4\xb8\xad");
  CHECK(part_cut(cjk, lockstep::detail::kPartBytes, gpt2) == kMaxStretchBytes - 1);

  // Through tokenize_files: the document is encoded as its two sides. A line of ASCII letters
  // is one pre-token merged in 64 KiB pieces (Note [Long pre-tokens]), and the cut falls on
  // one of theirs: the ids of the whole line.
  const TempDir dir;
  const Tokenizer t = small_tokenizer(dir);
  const std::string line = letters + std::string(100'000, 'e');
  lockstep::TokenizeOptions opt;
  opt.inputs = {dir.write("line.txt", line), dir.write("cjk.txt", cjk)};
  opt.out = dir.path() / "out.bin";
  lockstep::tokenize_files(t, opt);
  std::vector<TokenId> expected = document_ids(t, line);
  const std::vector<TokenId> first = document_ids(t, std::string_view(cjk).substr(0, kMaxStretchBytes - 1));
  expected.insert(expected.end(), first.begin(), first.end());
  t.encode(std::string_view(cjk).substr(kMaxStretchBytes - 1), expected);
  CHECK(lockstep::test::read_llmc(opt.out) == expected);
}

TEST_CASE("tokenize_files: documents become <|endoftext|> and their ids, read back as llm.c tokens") {
  const TempDir dir;
  const Tokenizer t = small_tokenizer(dir);
  std::mt19937 rng(2);
  // A long document (many parts), a short one, an empty one, and two JSON lines.
  const std::string long_doc = mixed_text(rng, 200'000), short_doc = "abc de\n";
  const std::string j1 = "d\xc3\xa9" "b ace \"q\"", j2 = std::string(40'000, 'e') + " end\n";
  lockstep::TokenizeOptions opt;
  opt.inputs = {dir.write("long.txt", long_doc), dir.write("short.txt", short_doc),
                dir.write("empty.txt", ""), dir.write("docs.jsonl", jsonl_line(j1) + jsonl_line(j2))};
  opt.out = dir.path() / "train.bin";
  std::vector<lockstep::TokenizeProgress> progress;
  opt.on_progress = [&](const lockstep::TokenizeProgress& p) { progress.push_back(p); };
  const lockstep::TokenizeCounts c = lockstep::tokenize_files(t, opt);

  std::vector<TokenId> expected;
  for (const std::string_view doc : {std::string_view(long_doc), std::string_view(short_doc),
                                     std::string_view(), std::string_view(j1), std::string_view(j2)}) {
    const std::vector<TokenId> ids = document_ids(t, doc);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(lockstep::test::read_llmc(opt.out) == expected);
  CHECK(c.documents == 5);
  CHECK(c.train_tokens == expected.size());
  CHECK(c.eval_tokens == 0);
  CHECK(c.token_bytes == 2);
  CHECK(c.bytes == long_doc.size() + short_doc.size() + fs::file_size(opt.inputs[3]));
  REQUIRE(!progress.empty());
  CHECK(progress.back().tokens == expected.size());
  // The trainer's reader takes the file as it is.
  const lockstep::TokenDataset data =
      lockstep::load_tokens(opt.out, lockstep::TokenFormat::llmc, 64, static_cast<int>(t.vocab_size()));
  CHECK(data.token_count() == expected.size());
  // No temp file is left beside it.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++files;
  CHECK(files == 6);
}

TEST_CASE("tokenize_files: the eval split takes about its fraction, in whole parts") {
  const TempDir dir;
  const Tokenizer t = small_tokenizer(dir);
  std::mt19937 rng(3);
  std::string jsonl;
  std::vector<std::vector<TokenId>> docs;
  for (int i = 0; i < 500; ++i) {
    const std::string text = mixed_text(rng, 50 + rng() % 2000, /*invalid=*/false);
    jsonl += jsonl_line(text);
    docs.push_back(document_ids(t, text));
  }
  lockstep::TokenizeOptions opt;
  opt.inputs = {dir.write("docs.jsonl", jsonl)};
  opt.out = dir.path() / "train.bin";
  opt.eval_out = dir.path() / "val.bin";
  opt.eval_fraction = 0.1;
  const lockstep::TokenizeCounts c = lockstep::tokenize_files(t, opt);
  const std::vector<TokenId> train = lockstep::test::read_llmc(opt.out), eval = lockstep::test::read_llmc(opt.eval_out);
  CHECK(train.size() == c.train_tokens);
  CHECK(eval.size() == c.eval_tokens);
  const double share = static_cast<double>(eval.size()) / static_cast<double>(eval.size() + train.size());
  CHECK(share == doctest::Approx(0.1).epsilon(0.05));
  // Every document is whole in one of the two, in order.
  std::size_t at_train = 0, at_eval = 0, in_eval = 0;
  for (const std::vector<TokenId>& doc : docs) {
    const bool train_has = std::equal(doc.begin(), doc.end(), train.begin() + static_cast<long>(at_train),
                                      train.begin() + static_cast<long>(std::min(train.size(), at_train + doc.size())));
    if (train_has && at_train + doc.size() <= train.size()) {
      at_train += doc.size();
    } else {
      REQUIRE(at_eval + doc.size() <= eval.size());
      REQUIRE(std::equal(doc.begin(), doc.end(), eval.begin() + static_cast<long>(at_eval)));
      at_eval += doc.size();
      ++in_eval;
    }
  }
  CHECK(at_train == train.size());
  CHECK(at_eval == eval.size());
  CHECK(in_eval > 20);
}

TEST_CASE("tokenize_files: uint32 tokens (llm.c version 2) above 65,536 ids") {
  const TempDir dir;
  const Tokenizer t = small_tokenizer(dir, 65'400);
  REQUIRE(t.vocab_size() > 65'536);
  lockstep::TokenizeOptions opt;
  const std::string text = "abcde abcde edcba\n";
  opt.inputs = {dir.write("a.txt", text)};
  opt.out = dir.path() / "train.bin";
  CHECK(lockstep::tokenize_files(t, opt).token_bytes == 4);
  CHECK(lockstep::test::read_llmc(opt.out) == document_ids(t, text));
  opt.format = lockstep::TokenFormat::raw;
  CHECK_THROWS_WITH_AS(lockstep::tokenize_files(t, opt),
                       doctest::Contains("--format raw: holds uint16 tokens"), lockstep::InputError);
}

TEST_CASE("tokenize_files: bad input names the file and line and writes nothing") {
  const TempDir dir;
  const Tokenizer t = small_tokenizer(dir);
  const fs::path out = dir.path() / "train.bin", kept = dir.path() / "kept.bin";
  std::ofstream(kept) << "an earlier file";
  const auto error = [&](const std::string& jsonl, const fs::path& output) {
    lockstep::TokenizeOptions opt;
    opt.inputs = {dir.write("a.txt", std::string(50'000, 'a')), dir.write("d.jsonl", jsonl)};
    opt.out = output;
    try {
      lockstep::tokenize_files(t, opt);
    } catch (const lockstep::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string name = (dir.path() / "d.jsonl").string();
  const std::string good = "{\"text\": \"ab\"}\n";
  CHECK(error(good + good + "{\"text\": \"ab\"\n", out) ==
        name + ":3: column 14: invalid JSON: expected ',' or '}', got the end of the text");
  CHECK(error(good + "{\"title\": \"ab\"}\n", out) ==
        name + ":2: no \"text\" field: expected a JSON object with a \"text\" string");
  CHECK(error(good + "{\"text\": 5}\n", out) == name + ":2: column 10: \"text\": expected a string, got a number");
  CHECK(error(good + "\n" + good, out) == name + ":2: an empty line: expected a JSON object with a \"text\" string");
  CHECK(error("[1]\n", out) == name + ":1: expected a JSON object with a \"text\" string, got an array");
  CHECK(error(good + "{\"text\": \"\\ud800\"}\n", out).starts_with(name + ":2: column 11: invalid JSON: high surrogate without a low surrogate"));
  CHECK(!fs::exists(out));
  CHECK(error(good + "{}\n", kept).starts_with(name + ":2:"));
  CHECK(lockstep::test::read_text(kept) == "an earlier file");
  // A missing input fails before anything is read.
  lockstep::TokenizeOptions opt;
  opt.inputs = {dir.write("a.txt", "abc"), dir.path() / "missing.txt"};
  opt.out = out;
  CHECK_THROWS_WITH_AS(lockstep::tokenize_files(t, opt),
                       doctest::Contains("missing.txt: cannot open"), lockstep::InputError);
  CHECK(!fs::exists(out));
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++files;
  CHECK(files == 4);  // small.tiktoken, kept.bin, a.txt, d.jsonl: no temp file
}

TEST_CASE("tokenize_files: a stop ends the run and writes nothing") {
  const TempDir dir;
  const Tokenizer t = small_tokenizer(dir);
  std::atomic<bool> stop{false};
  lockstep::TokenizeOptions opt;
  // Several batches, the stop set after the first.
  std::mt19937 rng(4);
  opt.inputs = {dir.write("big.txt", mixed_text(rng, 3 * lockstep::detail::kBatchBytes))};
  opt.out = dir.path() / "train.bin";
  opt.eval_out = dir.path() / "val.bin";
  opt.eval_fraction = 0.01;
  opt.stop = &stop;
  int batches = 0;
  opt.on_progress = [&](const lockstep::TokenizeProgress&) {
    ++batches;
    stop = true;
  };
  CHECK_THROWS_AS(lockstep::tokenize_files(t, opt), lockstep::Interrupted);
  CHECK(batches == 1);
  CHECK(!fs::exists(opt.out));
  CHECK(!fs::exists(opt.eval_out));
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++files;
  CHECK(files == 2);
}
