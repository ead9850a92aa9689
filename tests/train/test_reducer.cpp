// The gradient reducer: bucket plans, bucketed + overlapped training against the single
// all-reduce path, gradient accumulation, and the trace.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include <stdlib.h>

#include "trainer_fixtures.hpp"
#include "io/json.hpp"
#include "lockstep/lockstep.hpp"
#include "train/reducer.hpp"

using namespace lockstep;

namespace {

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed, int features = 12) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, features, 4, seed));
}

Config config(int devices, int batch) {
  Config cfg = test::cpu_config(devices, batch, /*steps=*/10, /*seed=*/3);
  cfg.model.hidden = {64, 48, 32};
  cfg.model.activation = Activation::gelu;
  cfg.optimizer.weight_decay = 0.01;
  return cfg;
}

std::vector<float> train(const Config& cfg, Summary* summary = nullptr) {
  Trainer t(cfg, synthetic(240, 1), synthetic(40, 2));
  const Summary s = t.run();
  CHECK(s.replicas_identical);
  if (summary) *summary = s;
  return t.final_parameters();
}

}  // namespace

TEST_CASE("buckets: every parameter in exactly one bucket, caps respected, reverse order") {
  const Model model = Model::mlp({.inputs = 300, .hidden = {500, 400, 300}, .classes = 10});
  for (double cap_mb : {0.2, 0.5, 1.0, 25.0}) {
    CAPTURE(cap_mb);
    const auto buckets = detail::plan_buckets(model, cap_mb);
    std::vector<int> covered(model.param_count(), 0);
    std::size_t expect_begin = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const detail::Bucket& bucket = buckets[b];
      CHECK(bucket.begin == expect_begin);  // contiguous views, front to back
      expect_begin = bucket.end;
      for (std::size_t i = bucket.begin; i < bucket.end; ++i) ++covered[i];
      const double cap = (b == 0 ? std::min(1.0, cap_mb) : cap_mb) * 1024 * 1024;
      // Over the cap only when one layer alone is bigger than it.
      if (static_cast<double>(bucket.bytes()) > cap) CHECK(bucket.layers.size() == 1);
      for (std::size_t j = 1; j < bucket.layers.size(); ++j)
        CHECK(bucket.layers[j] < bucket.layers[j - 1]);  // backward order within a bucket
    }
    CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
    // The last layer, which backward finishes first, is in the first bucket.
    CHECK(buckets.front().layers.front() == model.layers().size() - 1);
    CHECK(buckets.back().layers.back() == 0);
  }
  // Small caps really split: 0.2 MB gives one bucket per Linear layer here.
  CHECK(detail::plan_buckets(model, 0.2).size() == 4);
  CHECK(detail::plan_buckets(model, 0.2).front().bytes() == (300 * 10 + 10) * sizeof(float));
  CHECK(detail::plan_buckets(model, 25.0).size() == 2);  // 1 MB first bucket, then the rest
}

TEST_CASE("bucketed and overlapped training is bitwise equal to one all-reduce after backward") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    Config whole = config(n, 8);
    whole.trainer.overlap = false;
    whole.trainer.bucket_cap_mb = 1000.0;
    Config bucketed = config(n, 8);
    bucketed.trainer.overlap = true;
    bucketed.trainer.bucket_cap_mb = 0.005;  // one bucket per Linear layer
    Summary s;
    const std::vector<float> a = train(whole), b = train(bucketed, &s);
    CHECK(s.buckets == 4);
    CHECK(a == b);
    // Clipping takes the path that waits for every bucket before the update: same bits too.
    whole.optimizer.clip_grad_norm = bucketed.optimizer.clip_grad_norm = 0.05;
    CHECK(train(whole) == train(bucketed));
  }
}

TEST_CASE("comm mode: inline only when cores are scarce and overlap cannot help, or alone") {
  using detail::CommMode;
  ::unsetenv("LOCKSTEP_COMM_MODE");
  // (cores scarce, ranks, buckets)
  CHECK(detail::choose_comm_mode(true, 2, 1) == CommMode::inline_);
  CHECK(detail::choose_comm_mode(true, 2, 4) == CommMode::async);
  CHECK(detail::choose_comm_mode(false, 2, 1) == CommMode::async);
  CHECK(detail::choose_comm_mode(false, 1, 4) == CommMode::inline_);
  ::setenv("LOCKSTEP_COMM_MODE", "async", 1);
  CHECK(detail::choose_comm_mode(true, 2, 1) == CommMode::async);
  ::setenv("LOCKSTEP_COMM_MODE", "inline", 1);
  CHECK(detail::choose_comm_mode(false, 2, 4) == CommMode::inline_);
  ::setenv("LOCKSTEP_COMM_MODE", "threads", 1);
  CHECK_THROWS_AS(detail::choose_comm_mode(true, 2, 1), InputError);
  ::unsetenv("LOCKSTEP_COMM_MODE");
}

TEST_CASE("collectives inline on the worker's thread train bit-identical to async ones") {
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    Config cfg = config(3, 8);
    cfg.trainer.zero = zero;
    cfg.trainer.bucket_cap_mb = 0.005;  // four buckets, overlapped when async
    Summary async_summary, inline_summary;
    ::setenv("LOCKSTEP_COMM_MODE", "async", 1);
    const std::vector<float> a = train(cfg, &async_summary);
    ::setenv("LOCKSTEP_COMM_MODE", "inline", 1);
    const std::vector<float> b = train(cfg, &inline_summary);
    ::unsetenv("LOCKSTEP_COMM_MODE");
    CHECK(async_summary.comm_mode == "async");
    CHECK(inline_summary.comm_mode == "inline");
    CHECK(a == b);
    // Inline, the worker waits for the whole collective: none of it is hidden.
    CHECK(inline_summary.comm_s > 0.0);
    CHECK(inline_summary.comm_exposed_s >= inline_summary.comm_s * 0.99);
  }
}

TEST_CASE("k micro-batches of B equal one step of k*B") {
  for (int n : {1, 2}) {
    for (int k : {2, 3}) {
      CAPTURE(n);
      CAPTURE(k);
      Config micro = config(n, 4);
      micro.trainer.accumulate_steps = k;
      const Config big = config(n, 4 * k);
      CHECK(test::relative_difference(train(micro), train(big)) <= 1e-5);
    }
  }
}

TEST_CASE("accumulation counts samples and epochs in optimiser steps") {
  Config cfg = config(2, 10);
  cfg.trainer.steps = 0;
  cfg.trainer.epochs = 1;
  cfg.trainer.accumulate_steps = 3;
  Trainer t(cfg, synthetic(240, 1), synthetic(40, 2));
  // 240 samples / 2 workers / batch 10 = 12 batches per epoch = 4 optimiser steps of 3.
  CHECK(t.total_steps() == 4);
  const Summary s = t.run();
  CHECK(s.samples == 240);
}

TEST_CASE("the trace is valid JSON with a track per worker and per communication thread") {
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "lockstep_trace_test.json";
  Config cfg = config(2, 8);
  cfg.trainer.trace = file.string();
  cfg.trainer.bucket_cap_mb = 0.005;
  cfg.trainer.eval_every = 5;
  train(cfg);
  std::ifstream in(file);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  const detail::JsonValue doc = detail::parse_json(text);
  const detail::JsonValue* events = nullptr;
  for (const auto& [key, value] : doc.members)
    if (key == "traceEvents") events = &value;
  REQUIRE(events != nullptr);
  std::set<std::string> names, threads;
  std::multiset<std::string> eval_steps;  // of every worker's eval spans
  for (const detail::JsonValue& e : events->items) {
    std::string name, ph;
    for (const auto& [key, value] : e.members) {
      if (key == "name") name = value.text;
      if (key == "ph") ph = value.text;
      if (key == "args" && name == "thread_name")
        for (const auto& [k2, v2] : value.members) threads.insert(v2.text);
      if (key == "args" && name == "eval")
        for (const auto& [k2, v2] : value.members)
          if (k2 == "step") eval_steps.insert(v2.text);
    }
    if (ph == "X") names.insert(name);
  }
  // eval_every 5 of 10 steps: at step 5, and the final eval at 10, on both workers.
  CHECK(eval_steps == std::multiset<std::string>{"10", "10", "5", "5"});
  CHECK(threads == std::set<std::string>{"worker 0", "worker 1", "comm 0", "comm 1"});
  for (const char* expected : {"warm-up", "forward", "backward", "backward layers.0",
                               "backward layers.6", "all-reduce bucket 0", "all-reduce bucket 3",
                               "optimizer", "barrier", "data wait", "eval", "replica check"})
    CHECK_MESSAGE(names.count(expected) == 1, expected);
  std::filesystem::remove(file);
}

TEST_CASE("bf16 reduction: each rank's bucket rounds to bf16, the average rounds once, back in fp32") {
  // Note [bf16 gradient reduction]. Rank 0's gradients 1 + 2^-8 round (a tie) to 1, rank 1's
  // 2.015625 is a bf16 already; their average 1.5078125 is a bf16 too, and comes back exactly.
  // In fp32 the average would be 1.509765625.
  const Model model = Model::mlp({.inputs = 300, .hidden = {500}, .classes = 10});
  const std::vector<float> fill{1.00390625f, 2.015625f};
  auto comms = make_shared_memory_group(2);
  std::vector<std::vector<float>> result(2);
  std::vector<std::size_t> bytes(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto dev = make_cpu_device(r, 1);
      comms[r]->attach(*dev);
      DeviceArray<float> grads(*dev, model.param_count());
      dev->fill(grads.data(), fill[r], grads.size());
      // Two buckets (cap 0.5 MB: the output layer, then the 602 KB first layer), all launched.
      detail::Reducer reducer(model, *comms[r], *dev, grads.data(),
                              detail::plan_buckets(model, 0.5), /*overlap=*/true, /*zero=*/false,
                              detail::CommMode::async, ReduceDtype::bf16, nullptr);
      reducer.launch_remaining();
      for (std::size_t i = 0; i < reducer.buckets().size(); ++i) reducer.wait(i);
      result[r] = grads.download();
      bytes[r] = reducer.bytes_per_step();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CHECK(bytes[r] == 2 * model.param_count());
    CHECK(std::all_of(result[r].begin(), result[r].end(), [](float g) { return g == 1.5078125f; }));
  }
}

TEST_CASE("trainer.grad_reduce_dtype: bf16 halves the bytes, keeps replicas identical and the loss") {
  Config cfg = config(2, 5);
  Summary fp32, bf16;
  const std::vector<float> reference = train(cfg, &fp32);
  cfg.trainer.grad_reduce_dtype = ReduceDtype::bf16;
  const std::vector<float> rounded = train(cfg, &bf16);  // checks replicas_identical
  CHECK(fp32.reduce_bytes_per_step == 4 * fp32.parameters);
  CHECK(bf16.reduce_bytes_per_step == 2 * bf16.parameters);
  CHECK(bf16.reduce_dtype == "bf16");
  // The rounding shows: 8 significant bits on each step's gradient, which AdamW's normalised
  // steps carry into the weights (3% apart after these 10 steps), while the loss stays.
  const double moved = test::relative_difference(rounded, reference);
  CHECK(moved > 0.0);
  CHECK(moved < 0.1);
  CHECK(bf16.eval_loss == doctest::Approx(fp32.eval_loss).epsilon(0.02));
}

TEST_CASE("ZeRO-2's bucket buffers: the tied embedding's bucket is held, the others rotate") {
  // Note [ZeRO-2]: a GPT's LM head writes into the token embedding's gradients first, the
  // embedding last, so its bucket is open all through backward.
  const Model model = Model::gpt({.vocab_size = 64, .context = 8, .n_layer = 4, .n_head = 2,
                                  .d_model = 32});
  const std::vector<detail::Bucket> buckets = detail::plan_buckets(model, 0.02, 0.02);
  REQUIRE(buckets.size() >= 5);
  const detail::GradientSlots slots = detail::plan_gradient_slots(model, buckets);
  CHECK(slots.held == 1);
  const std::size_t embedding = buckets.size() - 1;  // layer 0 sits at the end of the buffer
  CHECK(buckets[embedding].layers == std::vector<std::size_t>{0});
  CHECK(slots.retires[embedding] == detail::GradientSlots::kNone);
  CHECK(slots.retires[0] == detail::GradientSlots::kNone);
  CHECK(slots.retires[1] == detail::GradientSlots::kNone);
  CHECK(slots.retires[2] == 0);  // the third rotating bucket takes the first one's buffer
  CHECK(slots.retires[3] == 1);
  std::size_t largest = 0;
  for (const detail::Bucket& b : buckets) largest = std::max(largest, b.end - b.begin);
  CHECK(slots.floats < model.param_count());
  CHECK(slots.floats <= (buckets[embedding].end - buckets[embedding].begin) + 2 * largest + 48);
  for (std::size_t b = 0; b < buckets.size(); ++b)  // the gradient buffer's alignment, kept
    CHECK(slots.at[b] % 16 == buckets[b].begin % 16);
}
