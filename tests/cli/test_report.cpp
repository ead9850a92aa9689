// `trainer.report: FILE` end to end: the HTML page of a short run is complete, self-contained
// and holds the charts and the per-worker table.
#include <doctest/doctest.h>

#include "cli_runner.hpp"
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

namespace fs = std::filesystem;

namespace {

using Result = lockstep::test::CliResult;
using lockstep::test::run_cli;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The first tag that names an attribute twice (which XML, and so SVG, forbids), or "".
std::string tag_with_repeated_attribute(const std::string& html) {
  static const std::regex tag(R"(<[a-zA-Z]+\s[^>]*>)"), attribute(R"(\s([a-zA-Z-]+)=)");
  for (auto t = std::sregex_iterator(html.begin(), html.end(), tag); t != std::sregex_iterator(); ++t) {
    const std::string text = t->str();
    std::set<std::string> names;
    for (auto a = std::sregex_iterator(text.begin(), text.end(), attribute); a != std::sregex_iterator(); ++a)
      if (!names.insert((*a)[1].str()).second) return text;
  }
  return "";
}

const std::string kQuickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";

}  // namespace

TEST_CASE("cli: trainer.report writes a self-contained HTML report") {
  const fs::path dir = fs::temp_directory_path() / "lockstep_report_test";
  fs::create_directories(dir);
  const fs::path file = dir / "run.html";
  fs::remove(file);
  const Result r = run_cli("train " + kQuickstart +
                           " --set trainer.devices=2 --set trainer.steps=40 --set trainer.eval_every=10"
                           " --set trainer.report=" + file.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  std::ifstream f(file);
  REQUIRE(f);
  const std::string html{std::istreambuf_iterator<char>(f), {}};

  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(html.ends_with("</html>\n"));
  // Loss, accuracy, throughput and learning rate (warmup_cosine changes it), and the workers.
  CHECK(count(html, "<svg ") == 5);
  CHECK(count(html, "</svg>") == 5);
  CHECK(count(html, "<table") == count(html, "</table>"));
  CHECK(count(html, "<text") == count(html, "</text>"));
  CHECK(tag_with_repeated_attribute(html) == "");
  CHECK(html.find("<polyline") != std::string::npos);
  CHECK(count(html, "<circle") == 4 * 2);  // eval at steps 10, 20, 30 and 40: loss and accuracy
  CHECK(html.find("Where each worker's time went") != std::string::npos);
  CHECK(html.find("<td>0</td>") != std::string::npos);  // one row per rank in the worker table
  CHECK(html.find("<td>1</td>") != std::string::npos);
  CHECK(html.find("communication (exposed)") != std::string::npos);
  CHECK(html.find("replicas identical") != std::string::npos);
  // The precision alone; the matrix products' library has a row of its own.
  CHECK(html.find("<th>precision</th><td>fp32</td>") != std::string::npos);
  CHECK(html.find("<th>matrix products</th><td>") != std::string::npos);
  // Sizes in binary units, not raw bytes (the quickstart's parameters take some KiB).
  CHECK(std::regex_search(html, std::regex("<th>worker memory</th><td>parameters [0-9]+\\.[0-9] "
                                           "(KiB|MiB), gradients [0-9]+\\.[0-9] (KiB|MiB), ")));
  CHECK(std::regex_search(html, std::regex("<th>optimizer state</th><td>[0-9.]+ (B|KiB|MiB) per "
                                           "worker at most")));
  CHECK(html.find("One point per step.") != std::string::npos);
  // Nothing is fetched from anywhere: no links, no scripts, no external resources.
  CHECK(html.find("http") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=") == std::string::npos);
  CHECK(html.find("@import") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  CHECK(html.find("nan") == std::string::npos);  // every coordinate is finite
}

// Issue 42 item 9: each line says something about this run on this machine.
TEST_CASE("cli: output that means something: no GPU-only lines on the CPU, no token fields for an MLP, a GPT's report shows tokens/s and attention") {
  const fs::path dir = fs::temp_directory_path() / "lockstep_report_meaning";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Result mlp = run_cli("train " + kQuickstart + " --set trainer.backend=cpu --set trainer.steps=3 "
                             "--set trainer.checkpoint.dir=null --summary-json " + (dir / "mlp.json").string());
  REQUIRE_MESSAGE(mlp.code == 0, mlp.output);
  CHECK(mlp.output.find("fused linear") == std::string::npos);  // the CPU composes every product
  std::ifstream j(dir / "mlp.json");
  const std::string json{std::istreambuf_iterator<char>(j), {}};
  CHECK(json.find("\"samples_per_s\"") != std::string::npos);
  CHECK(json.find("tokens_per_s") == std::string::npos);
  CHECK(json.find("flops_per_token") == std::string::npos);

  const fs::path html_file = dir / "gpt.html";
  const Result gpt = run_cli("train \"" LOCKSTEP_SOURCE_DIR "/configs/gpt_tiny.yaml\" --set model.context=16 "
                             "--set model.n_layer=1 --set model.d_model=32 --set trainer.steps=2 "
                             "--set trainer.eval_every=0 --set trainer.checkpoint.dir=null "
                             "--set trainer.report=" + html_file.string());
  REQUIRE_MESSAGE(gpt.code == 0, gpt.output);
  std::ifstream h(html_file);
  const std::string html{std::istreambuf_iterator<char>(h), {}};
  CHECK(html.find("<tr><th>tokens/s</th><td>") != std::string::npos);
  CHECK_MESSAGE(html.find("<tr><th>attention</th><td>materialized: ") != std::string::npos, html);

  // A plan for a GPU only where there is one.
  const Result devices = run_cli("devices");
  REQUIRE(devices.code == 0);
  if (devices.output.find("GPU(s)") == std::string::npos)
    CHECK_MESSAGE(devices.output.find("cuda: attention") == std::string::npos, devices.output);
  fs::remove_all(dir);
}

TEST_CASE("cli: trainer.report into a directory that cannot be made is bad input, before training") {
  const Result r = run_cli("train " + kQuickstart + " --set trainer.report=/dev/null/dir/run.html");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.output.find("error: trainer.report /dev/null/dir: '/dev/null' is not a directory") !=
                    std::string::npos,
                r.output);
  CHECK(r.output.find("training ") == std::string::npos);
}
