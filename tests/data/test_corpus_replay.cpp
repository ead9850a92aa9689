// Replays tests/corpus/, the bad inputs that the libFuzzer harnesses of tests/fuzz/ start from
// (scripts/ci_fuzz.sh): every file must give an InputError whose message names it, and nothing
// else; files under a valid/ folder must load. Crash reproducers found by fuzzing are added
// there, so these tests keep them fixed in every build, sanitized or not.
//
// The token files are read by extension: *.bin as token files (format auto), *.txt as text.
// The idx files are named for their role: images-* is read as images beside valid/labels.idx,
// labels-* as labels beside valid/images.idx.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/state_file.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kCorpus = fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "corpus";

struct CorpusFile {
  fs::path path;
  bool valid = false;  // under a valid/ folder
};

// Every file under tests/corpus/<kind>, sorted so that failures read the same on every run.
std::vector<CorpusFile> corpus(const std::string& kind) {
  std::vector<CorpusFile> files;
  for (const auto& entry : fs::recursive_directory_iterator(kCorpus / kind)) {
    if (!entry.is_regular_file()) continue;
    const bool valid = entry.path().parent_path().filename() == "valid";
    files.push_back({entry.path(), valid});
  }
  std::sort(files.begin(), files.end(),
            [](const CorpusFile& a, const CorpusFile& b) { return a.path < b.path; });
  REQUIRE_MESSAGE(files.size() >= 2, "no corpus under " << (kCorpus / kind).string());
  return files;
}

// The InputError message `load` throws, or nullopt when it loads. Any other exception escapes
// and fails the test case.
std::optional<std::string> input_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const lockstep::InputError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// A valid file loads; a bad one throws an InputError whose message names it (at the start, or
// anywhere when `anywhere`, for messages about two files).
void replay(const CorpusFile& file, const std::function<void()>& load, bool anywhere = false) {
  CAPTURE(file.path.string());
  const std::optional<std::string> error = input_error(load);
  if (file.valid) {
    CHECK_MESSAGE(!error.has_value(), *error);
    return;
  }
  REQUIRE_MESSAGE(error.has_value(), "loaded without an error");
  const std::string name = file.path.string();
  const std::size_t at = error->find(name);
  CHECK_MESSAGE((anywhere ? at != std::string::npos : at == 0), *error);
}

struct CliResult {
  int status = -1;  // as from waitpid
  std::string output;
};

CliResult run_cli(const fs::path& config) {
  const std::string cmd =
      fmt::format("\"{}\" train \"{}\" 2>&1", LOCKSTEP_CLI_PATH, config.string());
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  std::size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, got);
  r.status = pclose(pipe);
  return r;
}

}  // namespace

TEST_CASE("corpus: every bad config gives an InputError naming the file") {
  for (const CorpusFile& file : corpus("config"))
    replay(file, [&] { lockstep::load_config(file.path); });
}

TEST_CASE("corpus: lockstep train exits 2 for every bad config, and names it") {
  for (const CorpusFile& file : corpus("config")) {
    if (file.valid) continue;  // it would train
    CAPTURE(file.path.string());
    const CliResult r = run_cli(file.path);
    REQUIRE_MESSAGE(WIFEXITED(r.status), "killed by a signal: " << r.output);
    CHECK_MESSAGE(WEXITSTATUS(r.status) == 2, r.output);
    CHECK_MESSAGE(r.output.find(file.path.string()) != std::string::npos, r.output);
  }
}

TEST_CASE("corpus: every bad csv file gives an InputError naming the file") {
  for (const CorpusFile& file : corpus("csv"))
    replay(file, [&] { lockstep::load_csv(file.path, -1, false); });
}

TEST_CASE("corpus: every bad idx file gives an InputError naming the file") {
  const fs::path images = kCorpus / "idx" / "valid" / "images.idx";
  const fs::path labels = kCorpus / "idx" / "valid" / "labels.idx";
  REQUIRE(lockstep::load_idx(images, labels).size() == 3);
  for (const CorpusFile& file : corpus("idx")) {
    if (file.valid) continue;  // checked together above
    const std::string name = file.path.filename().string();
    if (name.starts_with("images-")) {
      replay(file, [&] { lockstep::load_idx(file.path, labels); }, /*anywhere=*/true);
    } else {
      REQUIRE_MESSAGE(name.starts_with("labels-"), name << ": expected images-* or labels-*");
      replay(file, [&] { lockstep::load_idx(images, file.path); }, /*anywhere=*/true);
    }
  }
}

TEST_CASE("corpus: every bad safetensors file gives an InputError naming the file") {
  for (const CorpusFile& file : corpus("safetensors"))
    replay(file, [&] { lockstep::read_safetensors(file.path); });
}

TEST_CASE("corpus: every bad checkpoint state file gives an InputError naming the file") {
  for (const CorpusFile& file : corpus("state"))
    replay(file, [&] { lockstep::detail::read_state_file(file.path); });
}

TEST_CASE("corpus: every bad tokenizer file gives an InputError naming the file") {
  for (const CorpusFile& file : corpus("tokenizer")) {
    REQUIRE_MESSAGE((file.path.extension() == ".tiktoken" || file.path.extension() == ".json"),
                    file.path.string() << ": .tiktoken or .json?");
    replay(file, [&] { lockstep::Tokenizer::load(file.path); });
  }
}

TEST_CASE("corpus: every bad token or text file gives an InputError naming the file") {
  for (const CorpusFile& file : corpus("tokens")) {
    if (file.path.extension() == ".txt") {
      replay(file, [&] { lockstep::load_text(file.path, 4); });
    } else {
      REQUIRE_MESSAGE(file.path.extension() == ".bin", file.path.string() << ": .bin or .txt?");
      replay(file,
             [&] { lockstep::load_tokens(file.path, lockstep::TokenFormat::automatic, 4, 50257); });
    }
  }
}
