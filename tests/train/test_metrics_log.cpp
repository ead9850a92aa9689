// trainer.metrics: one JSON object per logged step and per eval, each line whole and flushed
// when it is written (readable while the run is live), appended by a resumed run.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../data/temp_files.hpp"
#include "io/json.hpp"
#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;

namespace {

// Every line of `file`, each parsed as a JSON object.
std::vector<detail::JsonValue> records(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<detail::JsonValue> out;
  std::string line;
  while (std::getline(in, line)) {
    CAPTURE(line);
    out.push_back(detail::parse_json(line));  // throws on a partial or malformed line
    REQUIRE(out.back().kind == detail::JsonValue::Kind::object);
  }
  return out;
}

const detail::JsonValue& field(const detail::JsonValue& record, std::string_view key) {
  for (const auto& [name, value] : record.members)
    if (name == key) return value;
  FAIL("no key " << key);
  throw;
}

double number(const detail::JsonValue& record, std::string_view key) {
  return std::stod(field(record, key).text);
}

}  // namespace

TEST_CASE("trainer.metrics: a JSON line per run, logged step and eval, live, appended on resume") {
  const test::TempDir dir;
  auto train = std::make_shared<InMemoryDataset>(make_synthetic(160, 12, 4, 1));
  auto eval = std::make_shared<InMemoryDataset>(make_synthetic(40, 12, 4, 2));
  Config cfg = test::cpu_config(/*devices=*/2, /*batch=*/8, /*steps=*/10, /*seed=*/1);
  cfg.trainer.log_every = 5;
  cfg.trainer.eval_every = 10;
  cfg.trainer.metrics = (dir.path() / "made" / "metrics.jsonl").string();  // a new directory
  cfg.trainer.checkpoint.dir = (dir.path() / "ckpt").string();

  std::vector<StepMetrics> logged;
  const auto watch = [&](Trainer& t) {
    t.on_step([&](const StepMetrics& m) {
      // The line is in the file, whole, before the callback runs.
      const std::vector<detail::JsonValue> now = records(cfg.trainer.metrics);
      REQUIRE(!now.empty());
      CHECK(field(now.back(), "kind").text == "step");
      CHECK(number(now.back(), "step") == m.step);
      logged.push_back(m);
    });
  };
  Trainer first(cfg, train, eval);
  watch(first);
  first.run();

  cfg.trainer.steps = 20;
  Trainer second(cfg, train, eval);
  watch(second);
  second.resume_from(CheckpointManager::load(cfg.trainer.checkpoint.dir));
  const Summary s = second.run();

  const std::vector<detail::JsonValue> all = records(cfg.trainer.metrics);
  REQUIRE(all.size() == 8);
  const std::vector<std::string> kinds = {"run", "step", "step", "eval",
                                          "run", "step", "step", "eval"};
  const std::vector<double> steps = {0, 5, 10, 10, 0, 15, 20, 20};
  std::size_t next_step = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    CAPTURE(i);
    CHECK(field(all[i], "kind").text == kinds[i]);
    if (kinds[i] == "run") {  // each run opens its part of the stream
      const bool resumed = i > 0;
      CHECK(field(all[i], "config_hash").text == fmt::format("{:016x}", config_hash(cfg)));
      CHECK(number(all[i], "resumed_from_step") == (resumed ? 10 : 0));
      CHECK(field(all[i], "resumed_from").kind ==
            (resumed ? detail::JsonValue::Kind::string : detail::JsonValue::Kind::null));
      CHECK(number(all[i], "steps") == (resumed ? 20 : 10));
      CHECK(number(all[i], "workers") == 2);
      CHECK(std::regex_match(field(all[i], "start_time").text,
                             std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")));
      continue;
    }
    CHECK(number(all[i], "step") == steps[i]);
    if (kinds[i] == "step") {
      const StepMetrics& m = logged.at(next_step++);
      CHECK(number(all[i], "loss") == doctest::Approx(m.loss).epsilon(1e-8));
      CHECK(number(all[i], "lr") == doctest::Approx(m.lr).epsilon(1e-8));
      CHECK(number(all[i], "samples_per_s") == doctest::Approx(m.samples_per_s).epsilon(1e-8));
      CHECK(field(all[i], "mfu").kind == detail::JsonValue::Kind::null);  // no peak for a CPU
      for (const char* key : {"epoch", "accuracy", "grad_norm", "tokens_per_s",
                              "comm_hidden_fraction", "data_wait_s", "elapsed_s"})
        CHECK(field(all[i], key).kind == detail::JsonValue::Kind::number);
    }
  }
  CHECK(number(all.back(), "loss") == doctest::Approx(s.eval_loss).epsilon(1e-8));
  CHECK(number(all.back(), "samples") == 40);
}

TEST_CASE("trainer.metrics: a file that cannot be opened is bad input naming the key") {
  const test::TempDir dir;
  auto train = std::make_shared<InMemoryDataset>(make_synthetic(32, 12, 4, 1));
  Config cfg = test::cpu_config(1, 8, 1, 1);
  cfg.trainer.metrics = dir.path().string();  // a directory
  Trainer trainer(cfg, train, nullptr);
  const std::string expected = "trainer.metrics " + dir.path().string() + ": is a directory";
  CHECK_THROWS_WITH_AS(trainer.run(), doctest::Contains(expected.c_str()), InputError);
}

TEST_CASE("trainer.report: set through the C++ API, the trainer writes the page") {
  const test::TempDir dir;
  auto train = std::make_shared<InMemoryDataset>(make_synthetic(64, 12, 4, 1));
  Config cfg = test::cpu_config(2, 8, 6, 1);
  cfg.trainer.report = (dir.path() / "run.html").string();
  Trainer trainer(cfg, train, nullptr);
  trainer.run();
  std::ifstream in(cfg.trainer.report);
  const std::string html{std::istreambuf_iterator<char>(in), {}};
  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(html.find("One point per step.") != std::string::npos);  // the steps reached it
  CHECK(html.ends_with("</html>\n"));
}
