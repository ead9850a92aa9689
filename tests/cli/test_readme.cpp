// The code blocks of README.md and docs/*.md, run verbatim. Each block that follows the line
// "<!-- run by tests/cli/test_readme.cpp, verbatim -->" runs: the ```sh blocks, as one `bash -e`
// script each, in a scratch copy of the repository root: configs/ (copied, with the long runs
// shortened), third_party/ (linked) and build/lockstep (a link to the binary under test), so the
// commands run exactly as a user types them, and their outputs (runs/) stay out of the source
// tree; then the ```python blocks there, with a Python that has torch and safetensors. The
// README's blocks run first, then each docs/ file's in name order, so that a reference page may
// use what the guide made (docs/cli.md reads the quickstart's export). The ```cpp block is
// tests/cli/readme_example.cpp, which the build compiles as the README shows it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../data/temp_files.hpp"
#include "../interop/python_env.hpp"
#include "cli_runner.hpp"
#include "sanitized.hpp"
#include "skip.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kSource = LOCKSTEP_SOURCE_DIR;
constexpr std::string_view kMarker = "<!-- run by tests/cli/test_readme.cpp, verbatim -->";
// Blocks that make a Hugging Face directory with transformers: run with the environment of
// tests/interop/hf_venv.sh first on the PATH.
constexpr std::string_view kTransformersMarker =
    "<!-- run by tests/cli/test_readme.cpp with transformers, verbatim -->";

// The bodies of the blocks marked `marker` that open with `fence` ("```sh"), in order; a block
// indented in a list item is read without its indentation.
std::vector<std::string> marked_blocks(const std::string& readme, std::string_view fence,
                                       std::string_view marker = kMarker) {
  std::vector<std::string> blocks;
  std::istringstream in(readme);
  std::string line;
  bool marked = false, inside = false;
  std::size_t indent = 0;
  while (std::getline(in, line)) {
    const std::size_t first = line.find_first_not_of(' ');
    const std::string_view text =
        first == std::string::npos ? std::string_view() : std::string_view(line).substr(first);
    if (inside) {
      if (text == "```") inside = false;
      else blocks.back() += (line.size() >= indent ? line.substr(indent) : std::string()) + "\n";
    } else if (text == marker) {
      marked = true;
    } else if (marked && text.starts_with("```")) {
      inside = text == fence;
      if (inside) blocks.emplace_back();
      indent = first;
      marked = false;
    }
  }
  REQUIRE_MESSAGE(!inside, "an unterminated " << fence << " block");
  return blocks;
}

// The marked blocks of README.md, then of each docs/*.md in name order.
std::vector<std::string> guide_blocks(std::string_view fence, std::string_view marker = kMarker) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(kSource / "docs"))
    if (e.path().extension() == ".md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  files.insert(files.begin(), kSource / "README.md");
  std::vector<std::string> blocks;
  for (const fs::path& file : files) {
    CAPTURE(file);
    for (std::string& block : marked_blocks(lockstep::test::read_text(file), fence, marker))
      blocks.push_back(std::move(block));
  }
  return blocks;
}

// The eval losses a `lockstep train` printed ("eval step 6: loss 3.8002 ..."), in order.
std::vector<double> eval_losses(const std::string& output) {
  std::vector<double> losses;
  const std::regex line("eval step [0-9]+: loss ([0-9.]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it)
    losses.push_back(std::stod((*it)[1]));
  return losses;
}

// `text`, the config `name`, with each (pattern, replacement) of `edits` applied; a config that
// no longer has them fails the test.
std::string shortened(const std::string& text, const std::string& name,
                      std::initializer_list<std::pair<const char*, const char*>> edits) {
  std::string out = text;
  for (const auto& [pattern, replacement] : edits)
    out = std::regex_replace(out, std::regex(pattern), replacement);
  REQUIRE_MESSAGE(out != text, "configs/" << name << " changed: update the shortening here");
  return out;
}

// The shipped configs with the long runs shortened: gpt_tiny, gpt_tiny_bpe and finetune_tiny
// train 12 steps, evaluating and checkpointing every 6; sft_lora_tiny 40 steps, evaluating and
// checking replicas every 20. Nothing else changes.
void copy_configs(const fs::path& to) {
  fs::create_directories(to);
  for (const fs::directory_entry& e : fs::directory_iterator(kSource / "configs")) {
    std::string text = lockstep::test::read_text(e.path());
    const std::string name = e.path().filename().string();
    if (name == "gpt_tiny.yaml" || name == "gpt_tiny_bpe.yaml" || name == "finetune_tiny.yaml")
      text = shortened(text, name, {{"\n  steps: [0-9]+", "\n  steps: 12"},
                                    {"eval_every: [0-9]+", "eval_every: 6"},
                                    {"every_steps: [0-9]+", "every_steps: 6"}});
    else if (name == "sft_lora_tiny.yaml")
      text = shortened(text, name, {{"\n  steps: 600", "\n  steps: 40"}, {"every: 200", "every: 20"}});
    std::ofstream(to / name) << text;
  }
}

// A scratch copy of the repository root: configs/ (shortened), third_party/ (linked),
// build/lockstep (a link to the binary under test), and my_text.txt, the user's own text that
// the README fine-tunes on (a copy of the shipped notes on third-party files: prose the models
// were not trained on).
void make_root(const fs::path& root) {
  copy_configs(root / "configs");
  fs::copy_file(kSource / "third_party" / "README.md", root / "my_text.txt");
  fs::create_directory_symlink(kSource / "third_party", root / "third_party");
  fs::create_directories(root / "build");
  fs::create_symlink(fs::absolute(LOCKSTEP_CLI_PATH), root / "build" / "lockstep");
}


// GitHub's anchor of a heading: lower case, letters, digits, '-' and '_' kept, spaces as '-'.
std::string anchor_of(std::string_view heading) {
  std::string out;
  for (const char c : heading) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_') out += static_cast<char>(std::tolower(u));
    else if (c == ' ') out += '-';
  }
  return out;
}

// The anchors of a Markdown file's headings, outside code blocks.
std::vector<std::string> anchors_of(const std::string& text) {
  std::vector<std::string> anchors;
  std::istringstream in(text);
  std::string line;
  bool code = false;
  while (std::getline(in, line)) {
    if (line.starts_with("```")) code = !code;
    else if (!code && line.starts_with("#"))
      anchors.push_back(anchor_of(line.substr(line.find_first_not_of("# "))));
  }
  return anchors;
}
}  // namespace

TEST_CASE("README: the marked command blocks run verbatim from the repository root") {
  // They train gpt_tiny, which under TSan takes minutes; scripts/test.sh's plain build runs them.
  if (lockstep::test::kSanitized)
    return lockstep::test::skip(lockstep::test::Skip::setup,
                                "the README's commands run in the plain build (scripts/test.sh)");
  const std::vector<std::string> blocks = guide_blocks("```sh");
  REQUIRE(blocks.size() >= 3);
  const lockstep::test::TempDir root;
  make_root(root.path());

  std::string finetune_output;  // the offline fine-tune's
  for (const std::string& block : blocks) {
    CAPTURE(block);
    const fs::path script = root.write("block.sh", block);
    const auto r = lockstep::test::run_command("cd '" + root.path().string() + "' && bash -e " +
                                               script.string());
    CHECK_MESSAGE(r.code == 0, r.output);
    if (block.find("configs/finetune_tiny.yaml --init-from") != std::string::npos)
      finetune_output = r.output;
  }
  // The shipped configs write into runs/ of the root they run from.
  CHECK(fs::exists(root.path() / "runs" / "quickstart"));
  CHECK(fs::exists(root.path() / "runs" / "gpt_tiny"));
  CHECK(fs::exists(root.path() / "runs" / "quickstart.safetensors"));
  CHECK(fs::exists(root.path() / "runs" / "small_gpt2" / "merges.txt"));  // the GPT-2 story
  CHECK(fs::exists(root.path() / "runs" / "finetune"));
  // The offline fine-tune: the play's model goes on learning another text, whose held-out tail
  // it then predicts better at each eval (issue 42 item 3: once it fine-tuned on the play it
  // was trained on, and its eval loss rose).
  CHECK(fs::exists(root.path() / "runs" / "finetune_tiny"));
  const std::vector<double> losses = eval_losses(finetune_output);
  REQUIRE_MESSAGE(losses.size() >= 2, finetune_output);
  CHECK_MESSAGE(losses.back() < losses.front(), finetune_output);

  // The Python that reads the export back, from the same root.
  const std::vector<std::string> python_blocks = guide_blocks("```python");
  REQUIRE(python_blocks.size() == 1);
  const std::string python = lockstep::test::safetensors_python();
  if (python.empty()) return;  // skipped, saying why
  const fs::path script = root.write("block.py", python_blocks.front());
  const auto r = lockstep::test::run_command("cd '" + root.path().string() + "' && " + python +
                                             " " + script.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(std::regex_search(r.output, std::regex("^accuracy 0\\.9[0-9]* on 1797 samples\n$")),
                r.output);
}

TEST_CASE("README: the Hugging Face Llama story runs verbatim, its directory made by transformers") {
  if (lockstep::test::kSanitized)
    return lockstep::test::skip(lockstep::test::Skip::setup,
                                "the README's commands run in the plain build (scripts/test.sh)");
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;  // skipped, saying why
  const std::vector<std::string> blocks = guide_blocks("```sh", kTransformersMarker);
  REQUIRE(blocks.size() == 2);  // the story, then LoRA on conversations
  const lockstep::test::TempDir root;
  make_root(root.path());
  std::string output;
  for (const std::string& block : blocks) {
    CAPTURE(block);
    const fs::path script = root.write("block.sh", block);
    const auto r = lockstep::test::run_command(
        "cd '" + root.path().string() + "' && PATH='" + fs::path(python).parent_path().string() +
        "':\"$PATH\" bash -e " + script.string());
    REQUIRE_MESSAGE(r.code == 0, r.output);
    output += r.output;
  }
  // The model keys came from transformers' config.json, and the export is a Llama directory.
  CHECK_MESSAGE(output.find("model.family llama") != std::string::npos, output);
  CHECK_MESSAGE(output.find("model.n_kv_head 2") != std::string::npos, output);
  CHECK(lockstep::test::read_text(root.path() / "runs" / "tiny_llama_tuned_hf" / "config.json")
            .find("LlamaForCausalLM") != std::string::npos);
  // LoRA: only the adapters trained; the merged export and the PEFT adapter are written.
  CHECK_MESSAGE(output.find("27648 of 428832 parameters trained") != std::string::npos, output);
  // The base's end of sequence (<|im_end|>) went through the LoRA run into the merged export.
  CHECK(lockstep::test::read_text(root.path() / "runs" / "chat_lora_hf" / "config.json")
            .find("\"eos_token_id\": 1026") != std::string::npos);
  CHECK(fs::exists(root.path() / "runs" / "chat_lora_peft" / "adapter_config.json"));
}

TEST_CASE("README: the C++ embedding example is tests/cli/readme_example.cpp, and it trains") {
  const std::vector<std::string> blocks = guide_blocks("```cpp");
  REQUIRE(blocks.size() == 1);
  const fs::path example = kSource / "tests" / "cli" / "readme_example.cpp";
  CHECK_MESSAGE(blocks.front() == lockstep::test::read_text(example),
                "the README's C++ example and tests/cli/readme_example.cpp differ: make them one");
  const auto r = lockstep::test::run_command("\"" LOCKSTEP_README_EXAMPLE_PATH "\"");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find("step 200 loss ") != std::string::npos);
  std::smatch m;
  const std::regex summary("eval accuracy ([0-9.]+), replicas identical: 1\n");
  REQUIRE_MESSAGE(std::regex_search(r.output, m, summary), r.output);
  CHECK(std::stod(m[1]) > 0.85);
}

TEST_CASE("README and docs: every relative link names a file, and its anchor a heading there") {
  std::vector<fs::path> files = {kSource / "README.md"};
  for (const fs::directory_entry& e : fs::directory_iterator(kSource / "docs"))
    if (e.path().extension() == ".md") files.push_back(e.path());
  const std::regex link(R"(\]\(([^)\s]+)\))");
  int checked = 0;
  for (const fs::path& file : files) {
    const std::string text = lockstep::test::read_text(file);
    // Links outside code blocks.
    std::string prose;
    bool code = false;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.find("```") != std::string::npos) code = !code;
      else if (!code) prose += line + "\n";
    }
    for (auto it = std::sregex_iterator(prose.begin(), prose.end(), link);
         it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1];
      if (target.starts_with("http://") || target.starts_with("https://")) continue;
      CAPTURE(file);
      CAPTURE(target);
      const std::size_t hash = target.find('#');
      const fs::path named = file.parent_path() / target.substr(0, hash);
      const fs::path linked = hash == 0 ? file : named;
      REQUIRE_MESSAGE(fs::exists(linked), "a link to a file that does not exist");
      if (hash != std::string::npos) {
        const std::vector<std::string> anchors = anchors_of(lockstep::test::read_text(linked));
        CHECK_MESSAGE(std::find(anchors.begin(), anchors.end(), target.substr(hash + 1)) !=
                          anchors.end(),
                      "no heading with that anchor");
      }
      ++checked;
    }
  }
  CHECK(checked >= 30);
}

TEST_CASE("docs/config.md: the schema's longer explanations, which train --help leaves out") {
  // What the README's old key table explained at length now lives in the schema, after each
  // key's first line (visit_schema() in src/config/schema.hpp).
  const std::string docs = lockstep::test::read_text(kSource / "docs" / "config.md");
  const auto help = lockstep::test::run_cli("train --help");
  REQUIRE(help.code == 0);
  for (const char* longer : {"FlashAttention-2's algorithm", "bf16_compress_hook",
                             "tail -f follows a live run", "Note [Step graphs]"}) {
    CAPTURE(longer);
    CHECK(docs.find(longer) != std::string::npos);
    CHECK(help.output.find(longer) == std::string::npos);
  }
  // Each key's entry in --help stays two lines: the key, then one line of meaning.
  CHECK_MESSAGE(help.output.find("auto: the faster here\n  model.family") != std::string::npos,
                help.output);
}
