// The README's command blocks, run verbatim. Each ```sh block that follows the line
// "<!-- run by tests/cli/test_readme.cpp, verbatim -->" runs, as one `bash -e` script, in a
// scratch copy of the repository root: configs/ (copied, with the long runs shortened),
// third_party/ (linked) and build/lockstep (a link to the binary under test). So the commands
// run exactly as a user types them, and their outputs (runs/) stay out of the source tree.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"
#include "sanitized.hpp"
#include "skip.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kSource = LOCKSTEP_SOURCE_DIR;
constexpr std::string_view kMarker = "<!-- run by tests/cli/test_readme.cpp, verbatim -->";

// The bodies of the marked ```sh blocks, in order; a block indented in a list item is read
// without its indentation.
std::vector<std::string> marked_blocks(const std::string& readme) {
  std::vector<std::string> blocks;
  std::istringstream in(readme);
  std::string line;
  bool marked = false, inside = false;
  while (std::getline(in, line)) {
    line.erase(0, line.find_first_not_of(' ') == std::string::npos ? line.size()
                                                                   : line.find_first_not_of(' '));
    if (inside) {
      if (line == "```") inside = false;
      else blocks.back() += line + "\n";
    } else if (line == kMarker) {
      marked = true;
    } else if (marked && line == "```sh") {
      blocks.emplace_back();
      inside = true;
      marked = false;
    }
  }
  REQUIRE_MESSAGE(!inside, "an unterminated ```sh block in README.md");
  return blocks;
}

// The shipped configs with the long runs shortened: gpt_tiny trains 12 steps, evaluating and
// checkpointing every 6. Nothing else changes.
void copy_configs(const fs::path& to) {
  fs::create_directories(to);
  for (const fs::directory_entry& e : fs::directory_iterator(kSource / "configs")) {
    std::string text = lockstep::test::read_text(e.path());
    if (e.path().filename() == "gpt_tiny.yaml") {
      const std::string shipped = text;
      text = std::regex_replace(text, std::regex("\n  steps: 600"), "\n  steps: 12");
      text = std::regex_replace(text, std::regex("eval_every: 200"), "eval_every: 6");
      text = std::regex_replace(text, std::regex("every_steps: 200"), "every_steps: 6");
      REQUIRE_MESSAGE(text != shipped, "configs/gpt_tiny.yaml changed: update the shortening here");
    }
    std::ofstream(to / e.path().filename()) << text;
  }
}

}  // namespace

TEST_CASE("README: the marked command blocks run verbatim from the repository root") {
  // They train gpt_tiny, which under TSan takes minutes; scripts/test.sh's plain build runs them.
  if (lockstep::test::kSanitized)
    return lockstep::test::skip(lockstep::test::Skip::setup,
                                "the README's commands run in the plain build (scripts/test.sh)");
  const std::vector<std::string> blocks =
      marked_blocks(lockstep::test::read_text(kSource / "README.md"));
  REQUIRE(blocks.size() >= 3);
  const lockstep::test::TempDir root;
  copy_configs(root.path() / "configs");
  fs::create_directory_symlink(kSource / "third_party", root.path() / "third_party");
  fs::create_directories(root.path() / "build");
  fs::create_symlink(fs::absolute(LOCKSTEP_CLI_PATH), root.path() / "build" / "lockstep");

  for (const std::string& block : blocks) {
    CAPTURE(block);
    const fs::path script = root.write("block.sh", block);
    const auto r = lockstep::test::run_command("cd '" + root.path().string() + "' && bash -e " +
                                               script.string());
    CHECK_MESSAGE(r.code == 0, r.output);
  }
  // The shipped configs write into runs/ of the root they run from.
  CHECK(fs::exists(root.path() / "runs" / "quickstart"));
  CHECK(fs::exists(root.path() / "runs" / "gpt_tiny"));
  CHECK(fs::exists(root.path() / "runs" / "quickstart.safetensors"));
  CHECK(fs::exists(root.path() / "runs" / "gpt_tiny_tuned"));
  CHECK(fs::exists(root.path() / "runs" / "small_gpt2" / "merges.txt"));  // the fine-tuning story
  CHECK(fs::exists(root.path() / "runs" / "finetune"));
}
