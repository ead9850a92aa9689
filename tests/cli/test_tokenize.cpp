// `lockstep tokenize` end to end: a text file, JSON lines and standard input into one token
// file that `lockstep train` reads, and `lockstep sample --tokenizer` on the model it made; --eval-out; bad input exits 2 naming the file and line,
// having written nothing; SIGINT leaves no output behind.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../data/temp_files.hpp"
#include "../text/vocab_files.hpp"
#include "cli_runner.hpp"
#include "lockstep/tokenizer.hpp"

namespace fs = std::filesystem;
using lockstep::TokenId;
using lockstep::test::run_cli;
using lockstep::test::run_command;

namespace {

const std::string kShakespeare =
    std::string(LOCKSTEP_SOURCE_DIR) + "/third_party/shakespeare/as_you_like_it.txt";

// `p` quoted for the shell.
std::string q(const fs::path& p) {
  std::string out = "\"";
  out += p.string();
  out += '"';
  return out;
}

int count_files(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

struct Setup {
  lockstep::test::TempDir dir;
  fs::path vocab = dir.write("gpt2ish.tiktoken",
                             lockstep::test::rank_file(lockstep::test::random_vocab(300, 9)));
  lockstep::Tokenizer tokenizer = lockstep::Tokenizer::load(vocab);

  std::vector<TokenId> document(std::string_view text) const {
    std::vector<TokenId> ids{*tokenizer.end_of_text()};
    tokenizer.encode(text, ids);
    return ids;
  }
};

// `lockstep tokenize` of the play into DIR/train.bin and DIR/val.bin with --eval-fraction F.
lockstep::test::CliResult tokenize_play(const Setup& s, const std::string& fraction) {
  return run_cli("tokenize --tokenizer " + q(s.vocab) + " --out " + q(s.dir.path() / "train.bin") +
                 " --eval-out " + q(s.dir.path() / "val.bin") + " --eval-fraction " + fraction +
                 " " + q(kShakespeare));
}

}  // namespace

TEST_CASE("cli tokenize: a text file, JSON lines and standard input in order, trained and sampled as text") {
  const Setup s;
  const fs::path jsonl = s.dir.write("docs.jsonl", "{\"text\": \"abc d\\u00e9\"}\n{\"text\": \"e \\ud83d\\ude00\", \"n\": 2}\n");
  const fs::path stdin_text = s.dir.write("stdin.txt", "from standard input\n");
  const fs::path out = s.dir.path() / "out" / "train.bin";
  fs::create_directory(s.dir.path() / "out");
  const auto r = run_cli("tokenize --tokenizer " + q(s.vocab) + " --out " + q(out) + " " +
                         q(kShakespeare) + " " + q(jsonl) + " - < " + q(stdin_text));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  std::vector<TokenId> expected;
  for (const std::string& doc : {lockstep::test::read_text(kShakespeare), std::string("abc d\xc3\xa9"),
                                 std::string("e \xf0\x9f\x98\x80"), lockstep::test::read_text(stdin_text)}) {
    const std::vector<TokenId> ids = s.document(doc);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(lockstep::test::read_llmc(out) == expected);
  CHECK(r.output.find("tokenized 4 documents") != std::string::npos);
  CHECK(r.output.find(std::to_string(expected.size()) + " tokens (uint16)") != std::string::npos);

  // The file trains as it is (data.dataset: tokens).
  const auto train = run_cli("train \"" LOCKSTEP_SOURCE_DIR "/configs/gpt_tiny.yaml\" --set data.dataset=tokens "
                             "--set data.path=" + q(out) + " --set model.vocab_size=" +
                             std::to_string(s.tokenizer.vocab_size()) +
                             " --set model.context=16 --set model.n_layer=1 --set model.d_model=32 "
                             "--set trainer.steps=2 --set trainer.eval_every=0 --set data.format=llmc "
                             "--set trainer.checkpoint.dir=" + q(s.dir.path() / "ckpt"));
  REQUIRE_MESSAGE(train.code == 0, train.output);

  // sample --tokenizer: the prompt as text, the continuation as text.
  const std::string ckpt = "--checkpoint " + q(s.dir.path() / "ckpt");
  const auto text = run_cli("sample " + ckpt + " --tokenizer " + q(s.vocab) +
                            " --prompt \"abc de\" --tokens 8 --temperature 0");
  REQUIRE_MESSAGE(text.code == 0, text.output);
  CHECK(text.output.starts_with("abc de"));
  const auto ids = run_cli("sample " + ckpt + " --prompt \"1 2\" --tokens 8 --temperature 0");
  REQUIRE_MESSAGE(ids.code == 0, ids.output);
  CHECK(ids.output.starts_with("1 2 "));
  // A tokenizer with more ids than the model is not the one it was trained with.
  const fs::path bigger = s.dir.write("bigger.tiktoken", lockstep::test::rank_file(
                                                             lockstep::test::random_vocab(400, 9)));
  const auto wrong = run_cli("sample " + ckpt + " --tokenizer " + q(bigger) + " --prompt abc");
  CHECK(wrong.code == 2);
  CHECK(wrong.output.find("ids, but the model has " + std::to_string(s.tokenizer.vocab_size())) !=
        std::string::npos);
}

TEST_CASE("cli: text trained through data.tokenizer samples as text with the recorded tokenizer") {
  const Setup s;
  const fs::path ckpt = s.dir.path() / "ckpt";
  const auto train = run_cli("train \"" LOCKSTEP_SOURCE_DIR "/configs/gpt_tiny.yaml\" --set data.tokenizer=" +
                             q(s.vocab) + " --set model.context=16 --set model.n_layer=1 "
                             "--set model.d_model=32 --set trainer.steps=2 --set trainer.eval_every=0 "
                             "--set trainer.checkpoint.dir=" + q(ckpt));
  REQUIRE_MESSAGE(train.code == 0, train.output);
  const std::string sample = "sample --checkpoint " + q(ckpt) + " --prompt \"abc de\" --tokens 8 --temperature 0";
  const auto text = run_cli(sample);
  REQUIRE_MESSAGE(text.code == 0, text.output);
  CHECK(text.output.starts_with("abc de"));
  // The same vocabulary elsewhere is the same tokenizer; another one is refused, naming both.
  const fs::path copy = s.dir.write("copy.tiktoken", lockstep::test::read_text(s.vocab));
  CHECK(run_cli(sample + " --tokenizer " + q(copy)).output == text.output);
  const fs::path other = s.dir.write("other.tiktoken", lockstep::test::rank_file(
                                                           lockstep::test::random_vocab(300, 10)));
  const auto wrong = run_cli(sample + " --tokenizer " + q(other));
  CHECK(wrong.code == 2);
  CHECK_MESSAGE(wrong.output.find("trained with the tokenizer " + fs::absolute(s.vocab).string() +
                                  " (content hash " + s.tokenizer.content_hash() + "), but " +
                                  other.string() + " has content hash") != std::string::npos,
                wrong.output);
  // The remedy: the flag, and where a copy of the original is.
  CHECK_MESSAGE(wrong.output.find("not the same vocabulary and merges. Give --tokenizer DIR|FILE "
                                  "naming a copy of the original (the files it was trained with: "
                                  "from where they came, or from the directory of a `lockstep "
                                  "export --format hf` of this run, which holds them)") !=
                    std::string::npos,
                wrong.output);
  // Changed where it was recorded: put back, or named elsewhere.
  const std::string original = lockstep::test::read_text(s.vocab);
  fs::copy_file(other, s.vocab, fs::copy_options::overwrite_existing);
  const auto changed = run_cli(sample);
  CHECK(changed.code == 2);
  CHECK_MESSAGE(changed.output.find("It has changed since: put the original back there, or give "
                                    "--tokenizer DIR|FILE naming a copy of the original") !=
                    std::string::npos,
                changed.output);
  std::ofstream(s.vocab, std::ios::binary) << original;
  // A tokenizer moved away is named, with the way out.
  fs::rename(s.vocab, s.dir.path() / "moved.tiktoken");
  const auto gone = run_cli(sample);
  CHECK(gone.code == 2);
  CHECK_MESSAGE(gone.output.find(s.vocab.string() + ", is gone (no such file or directory; content hash " +
                                 s.tokenizer.content_hash() + "): give "
                                 "--tokenizer DIR|FILE") != std::string::npos, gone.output);
}

TEST_CASE("cli: data.tokenizer_family reads a rank file as Llama 3's in training, and sample reads it back") {
  const Setup s;
  const fs::path model = s.dir.write("tokenizer.model",
                                     lockstep::test::rank_file(lockstep::test::random_vocab(300, 9)));
  const fs::path ckpt = s.dir.path() / "ckpt";
  const std::string train = "train \"" LOCKSTEP_SOURCE_DIR "/configs/gpt_tiny.yaml\" --set data.tokenizer=" +
                            q(model) + " --set model.context=16 --set model.n_layer=1 "
                            "--set model.d_model=32 --set trainer.steps=2 --set trainer.eval_every=0 "
                            "--set trainer.checkpoint.dir=" + q(ckpt);
  // A rank file under a name that does not say its family: refused, naming the key that does.
  const auto unnamed = run_cli(train);
  CHECK(unnamed.code == 2);
  CHECK_MESSAGE(unnamed.output.find("data.tokenizer_family") != std::string::npos, unnamed.output);
  const auto llama = run_cli(train + " --set data.tokenizer_family=llama3");
  REQUIRE_MESSAGE(llama.code == 0, llama.output);
  // The checkpoint records the family, and sample reads its text with it.
  const auto text = run_cli("sample --checkpoint " + q(ckpt) + " --prompt \"abc de\" --tokens 4 --temperature 0");
  REQUIRE_MESSAGE(text.code == 0, text.output);
  CHECK(text.output.starts_with("abc de"));
  const auto bad = run_cli(train + " --set data.tokenizer_family=llama2");
  CHECK(bad.code == 2);
  CHECK_MESSAGE(bad.output.find("data.tokenizer_family") != std::string::npos, bad.output);
  // The checkpoint's metadata (the safetensors header) names the family.
  const std::string header = lockstep::test::read_text(ckpt / "step_00000002.safetensors").substr(0, 16384);
  CHECK_MESSAGE(header.find("\"lockstep.tokenizer.family\":\"llama3\"") != std::string::npos, header);
}

TEST_CASE("cli tokenize: --eval-out holds about --eval-fraction of the tokens") {
  const Setup s;
  const fs::path train = s.dir.path() / "train.bin", val = s.dir.path() / "val.bin";
  const auto r = tokenize_play(s, "0.1");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::vector<TokenId> a = lockstep::test::read_llmc(train), b = lockstep::test::read_llmc(val);
  const double share = static_cast<double>(b.size()) / static_cast<double>(a.size() + b.size());
  CHECK(share > 0.05);
  CHECK(share < 0.15);
  CHECK(a.size() + b.size() == s.document(lockstep::test::read_text(kShakespeare)).size());
  CHECK(r.output.find(val.string() + ": " + std::to_string(b.size()) + " tokens") != std::string::npos);
}

TEST_CASE("cli tokenize: one book's --eval-fraction 0.02 holds out its last pages, and a short split says what it serves") {
  const Setup s;
  const fs::path train = s.dir.path() / "train.bin", val = s.dir.path() / "val.bin";
  const auto r = tokenize_play(s, "0.02");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::vector<TokenId> a = lockstep::test::read_llmc(train);
  std::vector<TokenId> b = lockstep::test::read_llmc(val);
  const double share = static_cast<double>(b.size()) / static_cast<double>(a.size() + b.size());
  CHECK(share == doctest::Approx(0.02).epsilon(0.01));
  // The eval file is the book's tail: training then eval is the document.
  std::vector<TokenId> both = a;
  both.insert(both.end(), b.begin(), b.end());
  CHECK(both == s.document(lockstep::test::read_text(kShakespeare)));
  CHECK(r.output.find("warning") == std::string::npos);

  // Fewer than GPT-2's 1024 + 1 tokens: a warning with the fraction that would do.
  const auto small = tokenize_play(s, "0.004");
  REQUIRE_MESSAGE(small.code == 0, small.output);
  b = lockstep::test::read_llmc(val);
  REQUIRE(b.size() < 1025);
  CHECK_MESSAGE(small.output.find("warning: " + val.string() + ": " + std::to_string(b.size()) +
                              " tokens: an eval file needs model.context + 1 tokens, so this one "
                              "serves a context of at most " + std::to_string(b.size() - 1)) !=
                    std::string::npos, small.output);
  CHECK(small.output.find("tokenize again with a larger --eval-fraction") != std::string::npos);

  // Training with a longer context names the fix, not only the count.
  const auto t = run_cli("train \"" LOCKSTEP_SOURCE_DIR "/configs/gpt_tiny.yaml\" --set data.dataset=tokens "
                         "--set data.path=" + q(train) + " --set data.eval_path=" + q(val) +
                         " --set model.vocab_size=" + std::to_string(s.tokenizer.vocab_size()) +
                         " --set model.context=" + std::to_string(b.size() + 10) +
                         " --set trainer.steps=1 --set trainer.checkpoint.dir=" + q(s.dir.path() / "ckpt"));
  CHECK(t.code == 2);
  CHECK_MESSAGE(t.output.find("data.eval_path: " + val.string() + ": " + std::to_string(b.size()) +
                              " tokens") != std::string::npos, t.output);
  CHECK_MESSAGE(t.output.find("Tokenize again with a larger --eval-fraction") != std::string::npos, t.output);
  CHECK(t.output.find("hold out the tail of data.path with data.eval_fraction") != std::string::npos);
}

TEST_CASE("cli tokenize: bad input exits 2 naming the file and line, having written nothing") {
  const Setup s;
  const fs::path out = s.dir.path() / "train.bin", val = s.dir.path() / "val.bin";
  const fs::path bad = s.dir.write("bad.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\", }\n");
  const auto r = run_cli("tokenize --tokenizer " + q(s.vocab) + " --out " + q(out) + " --eval-out " +
                         q(val) + " --eval-fraction 0.5 " + q(kShakespeare) + " " + q(bad));
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.output.find(bad.string() + ":2: column 15: invalid JSON") != std::string::npos, r.output);
  const fs::path missing = s.dir.path() / "missing.txt";
  const auto m = run_cli("tokenize --tokenizer " + q(s.vocab) + " --out " + q(out) + " " + q(missing));
  CHECK(m.code == 2);
  CHECK(m.output.find(missing.string() + ": cannot open") != std::string::npos);
  const auto v = run_cli("tokenize --tokenizer " + q(s.dir.path() / "none") + " --out " + q(out) + " " +
                         q(kShakespeare));
  CHECK(v.code == 2);
  const auto f = run_cli("tokenize --tokenizer " + q(s.vocab) + " --out " + q(out) + " --eval-out " +
                         q(val) + " --eval-fraction 2 " + q(kShakespeare));
  CHECK(f.code == 2);
  CHECK(f.output.find("--eval-fraction 2: expected a number in (0, 1)") != std::string::npos);
  CHECK(count_files(s.dir.path()) == 2);  // the vocabulary and bad.jsonl
}

TEST_CASE("cli tokenize: --tokenizer-family reads a rank file as Llama 3's, and --allow-special") {
  const Setup s;
  const fs::path model = s.dir.write("tokenizer.model",
                                     lockstep::test::rank_file(lockstep::test::random_vocab(300, 9)));
  const lockstep::Tokenizer llama = lockstep::Tokenizer::load(model, lockstep::TokenizerFamily::llama3);
  const std::string text = "ab <|eot_id|> cd\n";
  const fs::path input = s.dir.write("in.txt", text), out = s.dir.path() / "out.bin";
  const std::string base = "tokenize --tokenizer " + q(model) + " --tokenizer-family llama3 --out " +
                           q(out) + " " + q(input);
  // Each document starts with <|begin_of_text|>; <|eot_id|> is text unless allowed.
  REQUIRE(run_cli(base).code == 0);
  std::vector<TokenId> plain = llama.document_start();
  llama.encode(text, plain);
  CHECK(plain.front() == *llama.special_token("<|begin_of_text|>"));
  CHECK(lockstep::test::read_llmc(out) == plain);
  REQUIRE(run_cli(base + " --allow-special").code == 0);
  std::vector<TokenId> special = llama.document_start();
  llama.encode_with_special(text, special);
  CHECK(lockstep::test::read_llmc(out) == special);
  CHECK(std::count(special.begin(), special.end(), *llama.special_token("<|eot_id|>")) == 1);
  CHECK(special.size() < plain.size());
  // A name tiktoken files do not have needs the family; a family no file has is refused.
  const auto none = run_cli("tokenize --tokenizer " + q(model) + " --out " + q(out) + " " + q(input));
  CHECK(none.code == 2);
  CHECK_MESSAGE(none.output.find("--tokenizer-family") != std::string::npos, none.output);
  const auto bad = run_cli("tokenize --tokenizer " + q(model) + " --tokenizer-family llama2 --out " +
                           q(out) + " " + q(input));
  CHECK(bad.code == 2);
  CHECK(bad.output.find("--tokenizer-family: expected llama3, qwen2 or gpt2, got 'llama2'") !=
        std::string::npos);
  // A malformed tokenizer.json: exit 2 with the file, line and JSON path.
  const fs::path json = s.dir.write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {},\n"
                                                      "\"merges\": [\"a b\", 3]}}");
  const auto j = run_cli("tokenize --tokenizer " + q(json) + " --out " + q(out) + " " + q(input));
  CHECK(j.code == 2);
  CHECK_MESSAGE(j.output.find(json.string() + ":2: model.merges[1]: expected") != std::string::npos,
                j.output);
}

TEST_CASE("cli tokenize: SIGINT stops the run and leaves no output") {
  const Setup s;
  const fs::path out = s.dir.path() / "train.bin";
  // Standard input from a FIFO whose writer stays open: the run is still reading it when the
  // signal comes.
  const fs::path fifo = s.dir.path() / "fifo";
  const auto r = run_command("bash -c 'mkfifo " + q(fifo) + "; " + lockstep::test::cli_path() +
                             " tokenize --tokenizer " + q(s.vocab) + " --out " + q(out) + " - < " +
                             q(fifo) + " & pid=$!; exec 3>" + q(fifo) + "; printf \"some text\" >&3; "
                             "sleep 1; kill -INT $pid; wait $pid; echo exit=$?; rm " + q(fifo) + "'");
  CHECK_MESSAGE(r.output.find("exit=130") != std::string::npos, r.output);
  CHECK(r.output.find("stopped by signal 2: nothing written") != std::string::npos);
  CHECK(!fs::exists(out));
  CHECK(count_files(s.dir.path()) == 1);
}
