// CheckpointManager: round trips, pruning, and falling back past incomplete or corrupt
// checkpoints; and config_hash(), which a resumed run compares.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "checkpoint_fixtures.hpp"
#include "lockstep/config.hpp"
#include "train/resume_changes.hpp"

using namespace lockstep;
using namespace lockstep::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::int64_t> steps_of(const std::vector<CheckpointFiles>& files) {
  std::vector<std::int64_t> steps;
  for (const CheckpointFiles& f : files) steps.push_back(f.step);
  return steps;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void check_equal(const Checkpoint& a, const Checkpoint& b) {
  CHECK(same_bits(a.params, b.params));
  CHECK(a.state.step == b.state.step);
  CHECK(a.state.epoch == b.state.epoch);
  CHECK(a.state.batch_in_epoch == b.state.batch_in_epoch);
  CHECK(a.state.samples == b.state.samples);
  CHECK(a.state.config_hash == b.state.config_hash);
  CHECK(a.state.workers == b.state.workers);
  CHECK(a.state.optimizer == b.state.optimizer);
  CHECK(a.state.optimizer_steps == b.state.optimizer_steps);
  CHECK(a.state.seed == b.state.seed);
  REQUIRE(a.optimizer_state.size() == b.optimizer_state.size());
  for (std::size_t i = 0; i < a.optimizer_state.size(); ++i) {
    CHECK(a.optimizer_state[i].name == b.optimizer_state[i].name);
    CHECK(same_bits(a.optimizer_state[i].values, b.optimizer_state[i].values));
  }
}

// Saves steps 10, 20 and 30 into a fresh manager that keeps them all.
struct ThreeCheckpoints {
  TempDir tmp;
  Model model = small_model();
  CheckpointManager manager{tmp.path() / "ckpt", 0};
  ThreeCheckpoints() {
    for (const std::int64_t step : {10, 20, 30}) manager.save(make_checkpoint(model, step));
  }
  CheckpointFiles newest() const { return manager.list().back(); }
};

}  // namespace

TEST_CASE("checkpoint: save and load_latest round trip, bit-exact") {
  TempDir tmp;
  const Model model = small_model();
  CheckpointManager manager(tmp.path() / "new" / "dir", 3);
  CHECK_FALSE(manager.load_latest().has_value());  // no directory yet

  Checkpoint saved = make_checkpoint(model, 1234);
  saved.metadata["lockstep.model"] = "an architecture";
  const CheckpointFiles files = manager.save(saved);
  CHECK(files.weights.filename() == "step_00001234.safetensors");
  CHECK(files.state.filename() == "step_00001234.state");
  CHECK(names_in(manager.dir()) ==
        std::vector<std::string>{"step_00001234.safetensors", "step_00001234.state"});

  const std::optional<Checkpoint> loaded = manager.load_latest();
  REQUIRE(loaded.has_value());
  check_equal(*loaded, saved);
  CHECK(loaded->weights_file == files.weights);
  CHECK(loaded->metadata.at("lockstep.model") == "an architecture");
  CHECK(loaded->metadata.at("lockstep.step") == "1234");
  check_layout(*loaded, model.param_tensors());

  for (const fs::path& path : {manager.dir(), files.weights, files.state})
    check_equal(CheckpointManager::load(path), saved);
  CHECK_THROWS_WITH_AS(CheckpointManager::load(tmp.path() / "x.bin"),
                       doctest::Contains("expected a checkpoint directory or a .safetensors or "
                                         ".state file"),
                       InputError);
  CHECK_THROWS_WITH_AS(CheckpointManager::load(tmp.path()),
                       doctest::Contains("no checkpoint"), InputError);
}

TEST_CASE("checkpoint: check_layout names a tensor the model does not match") {
  ThreeCheckpoints c;
  const Checkpoint loaded = CheckpointManager::load(c.newest().weights);
  const Model other = Model::mlp({.inputs = 3, .hidden = {5}, .classes = 2});
  CHECK_THROWS_WITH_AS(check_layout(loaded, other.param_tensors()),
                       doctest::Contains((c.newest().weights.string() +
                                          ": tensor 'layers.0.weight': shape [4, 3], the model "
                                          "expects [5, 3]")
                                             .c_str()),
                       InputError);
}

TEST_CASE("checkpoint: keep_last keeps the newest K complete checkpoints") {
  TempDir tmp;
  const Model model = small_model();
  CheckpointManager manager(tmp.path(), 2);
  for (std::int64_t step = 100; step <= 500; step += 100) {
    manager.save(make_checkpoint(model, step));
    CHECK(manager.list().size() == std::min<std::size_t>(2, static_cast<std::size_t>(step / 100)));
  }
  CHECK(steps_of(manager.list()) == std::vector<std::int64_t>{400, 500});
  CHECK(names_in(tmp.path()) ==
        std::vector<std::string>{"step_00000400.safetensors", "step_00000400.state",
                                 "step_00000500.safetensors", "step_00000500.state"});

  // Saving an older step (a run resumed from an earlier checkpoint) never removes newer ones.
  manager.save(make_checkpoint(model, 50));
  CHECK(steps_of(manager.list()) == std::vector<std::int64_t>{50, 400, 500});

  CheckpointManager keep_all(tmp.path() / "all", 0);
  for (std::int64_t step = 1; step <= 4; ++step) keep_all.save(make_checkpoint(model, step));
  CHECK(keep_all.list().size() == 4);
}

TEST_CASE("checkpoint: a truncated or corrupt newest checkpoint falls back to the previous") {
  const auto fallback_warning = [](CheckpointManager& manager) {
    std::vector<std::string> warnings;
    const std::optional<Checkpoint> loaded =
        manager.load_latest([&](const std::string& w) { warnings.push_back(w); });
    REQUIRE(loaded.has_value());
    CHECK(loaded->state.step == 20);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].ends_with("; using the previous checkpoint step_00000020"));
    return warnings[0];
  };

  for (const bool state_file : {false, true}) {
    ThreeCheckpoints c;
    const fs::path victim = state_file ? c.newest().state : c.newest().weights;
    const std::string bytes = slurp(victim);
    for (std::size_t cut = 0; cut < bytes.size(); cut += 1 + cut / 3) {
      CAPTURE(victim);
      CAPTURE(cut);
      spit(victim, std::string_view(bytes).substr(0, cut));
      CHECK(fallback_warning(c.manager).starts_with(victim.string() + ": "));
      CHECK(steps_of(c.manager.list()) == std::vector<std::int64_t>{10, 20});
    }
    std::string flipped = bytes;
    flipped[bytes.size() - 3] = static_cast<char>(flipped[bytes.size() - 3] ^ 0x40);
    spit(victim, flipped);
    CHECK(fallback_warning(c.manager).find("checksum") != std::string::npos);
  }
}

TEST_CASE("checkpoint: a crash between the two files, or of two saves, is incomplete") {
  ThreeCheckpoints c;
  const CheckpointFiles newest = c.newest();
  const std::string old_state = slurp(newest.state);

  fs::remove(newest.state);  // the crash came after the weights' rename
  CHECK(steps_of(c.manager.list()) == std::vector<std::int64_t>{10, 20});
  std::vector<std::string> warnings;
  CHECK(c.manager.load_latest([&](const std::string& w) { warnings.push_back(w); })->state.step ==
        20);
  CHECK(warnings == std::vector<std::string>{newest.state.string() +
                                             ": missing (the save did not complete); using the "
                                             "previous checkpoint step_00000020"});

  // New weights for step 30 beside the state of an earlier save of step 30.
  Checkpoint again = make_checkpoint(c.model, 30);
  again.params[5] += 1.0f;
  write_safetensors(newest.weights, again.tensors, again.params);
  spit(newest.state, old_state);
  CHECK_THROWS_WITH_AS(CheckpointManager::load(newest.state),
                       doctest::Contains("the files are of two different saves"), InputError);
  CHECK(steps_of(c.manager.list()) == std::vector<std::int64_t>{10, 20});
}

TEST_CASE("checkpoint: temp files left over from a crash are ignored") {
  ThreeCheckpoints c;
  spit(c.manager.dir() / "step_00000040.safetensors.tmp", "half a file");
  spit(c.manager.dir() / "step_00000040.state.tmp", "LSTP");
  spit(c.manager.dir() / "step_40.state", "not a canonical name");
  std::vector<std::string> warnings;
  CHECK(c.manager.load_latest([&](const std::string& w) { warnings.push_back(w); })->state.step ==
        30);
  CHECK(warnings.empty());
  CHECK(steps_of(c.manager.list()) == std::vector<std::int64_t>{10, 20, 30});
}

TEST_CASE("checkpoint: nothing is removed when save fails") {
  TempDir tmp;
  const Model model = small_model();
  CheckpointManager manager(tmp.path(), 1);
  manager.save(make_checkpoint(model, 10));
  const std::vector<std::string> before = names_in(tmp.path());

  Checkpoint bad = make_checkpoint(model, 20);
  bad.optimizer_state[0].values.pop_back();
  CHECK_THROWS_AS(manager.save(bad), std::invalid_argument);
  bad = make_checkpoint(model, 20);
  bad.state.workers = 0;
  CHECK_THROWS_AS(manager.save(bad), std::invalid_argument);
  CHECK(names_in(tmp.path()) == before);

  // The rename fails (a directory is in the way), even for root, who ignores permissions.
  fs::create_directory(tmp.path() / "step_00000020.state");
  CHECK_THROWS_AS(manager.save(make_checkpoint(model, 20)), std::system_error);
  CHECK(steps_of(manager.list()) == std::vector<std::int64_t>{10});
  CHECK(fs::exists(tmp.path() / "step_00000010.state"));
  CHECK_FALSE(fs::exists(tmp.path() / "step_00000020.state.tmp"));
}

TEST_CASE("checkpoint: no valid checkpoint at all is an input error naming each") {
  ThreeCheckpoints c;
  for (const CheckpointFiles& f : c.manager.list()) spit(f.weights, "junk");
  const std::string what = input_error_of([&] { c.manager.load_latest(); });
  CHECK(what.starts_with(c.manager.dir().string() + ": none of the 3 checkpoints is valid: "));
  CHECK(what.find("step_00000010.safetensors: offset 0") != std::string::npos);
  CHECK(c.manager.list().empty());
}

TEST_CASE("config_hash: covers the math of training, not how or how long it runs") {
  Config base;
  base.trainer.steps = 100;
  const std::uint64_t h = config_hash(base);
  CHECK(h == config_hash(base));

  const auto differs = [&](auto change) {
    Config c = base;
    change(c);
    return config_hash(c) != h;
  };
  CHECK(differs([](Config& c) { c.model.hidden = {64, 64}; }));
  CHECK(differs([](Config& c) { c.model.activation = Activation::gelu; }));
  CHECK(differs([](Config& c) { c.data.batch_size = 33; }));
  CHECK(differs([](Config& c) { c.data.path = "other.csv"; }));
  CHECK(differs([](Config& c) { c.optimizer.lr = 0.0100001; }));
  CHECK(differs([](Config& c) { c.optimizer.beta2 = 0.99; }));
  CHECK(differs([](Config& c) { c.schedule.warmup_steps = 1; }));
  CHECK(differs([](Config& c) { c.trainer.seed = 1; }));

  CHECK_FALSE(differs([](Config& c) { c.data.prefetch = 8; }));
  // The same function, summed in another order, as trainer.precision.
  CHECK_FALSE(differs([](Config& c) { c.model.attention = AttentionKind::materialized; }));
  CHECK_FALSE(differs([](Config& c) { c.trainer.devices = {0, 1, 2}; }));
  CHECK_FALSE(differs([](Config& c) { c.trainer.steps = 5000; }));
  CHECK_FALSE(differs([](Config& c) { c.trainer.log_every = 1; }));
  CHECK_FALSE(differs([](Config& c) { c.trainer.backend = BackendKind::cpu; }));
  CHECK_FALSE(differs([](Config& c) { c.trainer.threads_per_device = 3; }));
  CHECK_FALSE(differs([](Config& c) { c.source = "elsewhere.yaml"; }));
}

TEST_CASE("config_values: every key with its value, and a resume may change only the safe ones") {
  Config base;
  base.trainer.steps = 100;
  const ConfigValues values = config_values(base);
  const auto value = [&](const std::string& key) {
    const auto it = std::find_if(values.begin(), values.end(),
                                 [&](const auto& kv) { return kv.first == key; });
    REQUIRE_MESSAGE(it != values.end(), key);
    return it->second;
  };
  CHECK(value("optimizer.lr") == "0.01");
  CHECK(value("trainer.steps") == "100");
  CHECK(value("trainer.devices") == "[0]");
  CHECK(value("trainer.checkpoint.dir") == "\"\"");  // an unset text, visibly
  CHECK(value("model.hidden") == fmt::format("[{}]", fmt::join(base.model.hidden, ",")));
  // Unset, data.tokenizer is not listed (nor hashed): a checkpoint from before the key resumes.
  CHECK(std::none_of(values.begin(), values.end(),
                     [](const auto& kv) { return kv.first == "data.tokenizer"; }));
  Config bpe = base;
  bpe.data.tokenizer = "gpt2/";
  CHECK(config_hash(bpe) != config_hash(base));

  Config changed = base;
  changed.optimizer.lr = 0.001;
  changed.trainer.steps = 200;
  changed.model.hidden = {7};
  const std::vector<ConfigChange> changes = detail::config_changes(values, config_values(changed));
  REQUIRE(changes.size() == 3);
  CHECK(changes[0].key == "model.hidden");
  CHECK(changes[0].now == "[7]");
  CHECK(changes[1].key == "optimizer.lr");
  CHECK(changes[1].checkpoint == "0.01");
  CHECK(changes[1].now == "0.001");
  CHECK(changes[2].key == "trainer.steps");

  for (const char* key : {"optimizer.lr", "optimizer.weight_decay", "optimizer.clip_grad_norm",
                          "schedule.type", "schedule.min_lr", "trainer.steps", "trainer.log_every",
                          "trainer.eval_every", "trainer.checkpoint.every_steps", "data.prefetch"})
    CHECK_MESSAGE(detail::resume_may_change(key), key);
  for (const char* key : {"model.hidden", "data.batch_size", "data.path", "optimizer.type",
                          "optimizer.momentum", "optimizer.beta1", "optimizer.decay_all",
                          "trainer.seed"})
    CHECK_MESSAGE(!detail::resume_may_change(key), key);
}
