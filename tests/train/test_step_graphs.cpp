// Note [Step graphs] in src/train/step_graphs.hpp, on a CPU device with CUDA's capture semantics
// (graph_test_device.hpp): a part captured once and replayed runs its ops on the memory of the
// moment and reports its layers after their segment; a refused capture falls back to the eager
// part and says why; auto keeps graphs only when they were timed faster; and whole runs with
// graphs, with several buckets, ZeRO-1, accumulation, bf16 and a short last batch, train bit
// for bit as runs that launch every op.
#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "graph_test_device.hpp"
#include "lockstep/lockstep.hpp"
#include "train/step_graphs.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
using detail::StepGraphs;

namespace {

std::unique_ptr<Communicator> one_rank() {
  const int ids[] = {0};
  return std::move(make_cpu_backend()->create_communicators(ids, nullptr).front());
}

// A part of three "layers" over x: y = x + 1, report 0; y *= 2, report 1; y += x, report 2.
struct Part {
  Device& device;
  DeviceArray<float> x, one, y;
  explicit Part(Device& d) : device(d), x(d, 4), one(d, 4), y(d, 4) {
    device.fill(one.data(), 1.0f, 4);
  }
  void enqueue(const StepGraphs::Layer& report) {
    device.add(x.data(), one.data(), y.data(), 4);
    if (report) report(0);
    device.scale(y.data(), 2.0f, 4);
    if (report) report(1);
    device.add(y.data(), x.data(), y.data(), 4);
    if (report) report(2);
  }
};

// What on_layer saw: each layer with y[0] at that moment.
struct Seen {
  const float* y;
  std::vector<std::string> events;
  StepGraphs::Layer on_layer() {
    return [this](std::size_t layer) { events.push_back(fmt::format("{}:{}", layer, y[0])); };
  }
};

const StepGraphs::Key kKey{.part = StepGraphs::Part::backward, .batch = 4, .reports_layers = true};

}  // namespace

TEST_CASE("step graphs: a captured part replays on the memory of the moment, cut where asked") {
  test::GraphTestDevice device(0, 1, {});
  auto comm = one_rank();
  StepGraphs graphs(device, GraphMode::on, /*first_step=*/1, /*total_steps=*/10);
  graphs.begin_step(1, 0.0, *comm);
  CHECK_FALSE(graphs.active());  // the run's first step runs as launched
  graphs.begin_step(2, 0.0, *comm);
  REQUIRE(graphs.active());

  Part part(device);
  Seen seen{part.y.data(), {}};
  std::vector<std::size_t> asked;
  const auto cut = [&](std::size_t layer) {
    asked.push_back(layer);
    return layer == 1;  // a collective starts after layer 1
  };
  // A new key runs as launched first (it may grow workspaces, which a capture refuses).
  device.fill(part.x.data(), 0.0f, 4);
  graphs.run(kKey, [&](const StepGraphs::Layer& r) { part.enqueue(r); }, seen.on_layer(), cut);
  CHECK(seen.events == std::vector<std::string>{"0:1", "1:2", "2:2"});
  CHECK(device.counts().captures == 0);
  CHECK(asked.empty());
  CHECK(graphs.summary().eager == 1);
  seen.events.clear();
  for (const float x : {1.0f, 5.0f}) {
    device.fill(part.x.data(), x, 4);
    graphs.run(kKey, [&](const StepGraphs::Layer& r) { part.enqueue(r); }, seen.on_layer(), cut);
  }
  // Each segment ran before its layers were reported: (x + 1) * 2 by layers 0 and 1, then + x.
  CHECK(seen.events == std::vector<std::string>{"0:4", "1:4", "2:5", "0:12", "1:12", "2:17"});
  CHECK(part.y.data()[3] == 17.0f);
  CHECK(asked == std::vector<std::size_t>{0, 1, 2});  // asked while capturing only
  CHECK(device.counts().captures == 2);  // two segments, captured once
  CHECK(device.counts().recorded == 3);
  CHECK(device.counts().launches == 4);
  const Summary::Graphs s = graphs.summary();
  CHECK(s.used);
  CHECK(s.captured == 1);
  CHECK(s.launched == 2);

  // Another key is another program, captured at its second run; a graph whose memory was
  // replaced is captured again.
  StepGraphs::Key other = kKey;
  other.batch = 3;
  for (int i = 0; i < 2; ++i)
    graphs.run(other, [&](const StepGraphs::Layer& r) { part.enqueue(r); }, seen.on_layer(), cut);
  CHECK(graphs.summary().captured == 2);
  CHECK(graphs.summary().eager == 2);
  device.replace_memory();
  graphs.run(kKey, [&](const StepGraphs::Layer& r) { part.enqueue(r); }, seen.on_layer(), cut);
  CHECK(graphs.summary().captured == 3);
  CHECK(device.counts().captures == 6);
}

TEST_CASE("step graphs: a refused capture is dropped, the part runs as launched, and graphs stop") {
  test::GraphTestDevice device(0, 1, "scale");
  auto comm = one_rank();
  StepGraphs graphs(device, GraphMode::on, 1, 10);
  graphs.begin_step(2, 0.0, *comm);
  Part part(device);
  Seen seen{part.y.data(), {}};
  device.fill(part.x.data(), 1.0f, 4);
  for (int i = 0; i < 2; ++i)  // the first run of a key is eager; the second tries a capture
    graphs.run(kKey, [&](const StepGraphs::Layer& r) { part.enqueue(r); }, seen.on_layer(),
               [](std::size_t) { return false; });
  // Nothing of the capture ran; the eager part did, once each time.
  CHECK(seen.events ==
        std::vector<std::string>{"0:2", "1:4", "2:5", "0:2", "1:4", "2:5"});
  CHECK(device.counts().aborted == 1);
  CHECK(device.counts().launches == 0);
  CHECK_FALSE(graphs.active());
  const Summary::Graphs s = graphs.summary();
  CHECK_FALSE(s.used);
  CHECK(s.why_not ==
        "a capture was refused, so every part runs as launched: scale cannot be captured (test "
        "device)");
  CHECK(describe_graphs(s) == "off (" + s.why_not + ")");
}

// Issue 40: a short last batch is a new key after the others were captured. It runs as
// launched once, then is captured; if that capture is refused, it alone runs as launched, for
// the rest of the run, while the other keys keep replaying their graphs.
TEST_CASE("step graphs: a new key runs eagerly first, and its refused capture leaves graphs on") {
  test::GraphTestDevice device(0, 1, "fill");  // only the short batch's part fills
  auto comm = one_rank();
  StepGraphs graphs(device, GraphMode::on, 1, 100);
  graphs.begin_step(2, 0.0, *comm);
  Part part(device);
  Seen seen{part.y.data(), {}};
  const auto never = [](std::size_t) { return false; };
  const auto full = [&](const StepGraphs::Layer& r) { part.enqueue(r); };
  const auto short_batch = [&](const StepGraphs::Layer& r) {
    device.fill(part.x.data(), 3.0f, 4);  // refused in a capture
    part.enqueue(r);
  };
  device.fill(part.x.data(), 1.0f, 4);
  for (int i = 0; i < 3; ++i) graphs.run(kKey, full, seen.on_layer(), never);
  CHECK(graphs.summary().captured == 1);
  CHECK(device.counts().launches == 2);
  StepGraphs::Key last = kKey;
  last.batch = 2;
  for (int i = 0; i < 3; ++i) {
    seen.events.clear();
    graphs.run(last, short_batch, seen.on_layer(), never);
    // Ran as launched each time, with x = 3: y = 4, 8, 11.
    CHECK(seen.events == std::vector<std::string>{"0:4", "1:8", "2:11"});
    CHECK(graphs.active());
  }
  CHECK(device.counts().aborted == 1);  // its capture tried once, at its second run
  const Summary::Graphs s = graphs.summary();
  CHECK(s.used);
  CHECK(s.why_not.empty());
  CHECK(s.refused == 1);
  CHECK(s.eager == 1 + 3);  // kKey's first run, and every run of the short batch
  CHECK(s.refusal == "fill cannot be captured (test device)");
  CHECK(describe_graphs(s).find("1 part(s) run as launched, their capture refused: fill") !=
        std::string::npos);
  // The full batch's graph still replays.
  device.fill(part.x.data(), 1.0f, 4);
  graphs.run(kKey, full, seen.on_layer(), never);
  CHECK(device.counts().launches == 3);
  CHECK(part.y.data()[0] == 5.0f);
}

TEST_CASE("step graphs: auto keeps them only where a step was timed faster with them") {
  for (const bool faster : {true, false}) {
    CAPTURE(faster);
    test::GraphTestDevice device(0, 1, {});
    auto comm = one_rank();
    StepGraphs graphs(device, GraphMode::automatic, /*first_step=*/11, /*total_steps=*/40);
    // Steps 12-16 eager at 10 ms; 17 and 18 capture (30 ms); 19-23 with graphs at 8 or 12 ms.
    double now = 0.0;
    for (std::int64_t step = 11; step <= 24; ++step) {
      graphs.begin_step(step, now, *comm);
      CHECK(graphs.active() == (step >= 17 && (faster || step < 24)));  // chosen at step 24
      now += step <= 16 ? 0.010 : step <= 18 ? 0.030 : faster ? 0.008 : 0.012;
    }
    const Summary::Graphs s = graphs.summary();
    CHECK(s.eager_step_s == doctest::Approx(0.010));
    CHECK(s.graph_step_s == doctest::Approx(faster ? 0.008 : 0.012));
    CHECK(graphs.active() == faster);
    if (!faster)
      CHECK(s.why_not ==
            "trainer.cuda_graphs: auto measured a step at 12.000 ms with graphs and 10.000 ms "
            "without (medians of 5 steps)");
  }
  test::GraphTestDevice device(0, 1, {});
  StepGraphs short_run(device, GraphMode::automatic, 1, 12);
  CHECK(short_run.summary().why_not ==
        "trainer.cuda_graphs: auto times 5 steps each way and needs a run of 14 steps; this one "
        "has 12 (on captures from the second step)");
  auto cpu = make_cpu_backend()->create_device(0, 1, 1);
  StepGraphs on_cpu(*cpu, GraphMode::on, 1, 100);
  CHECK(on_cpu.summary().why_not ==
        "the cpu backend runs each op as it is called: it has no graphs to capture");
  StepGraphs off(device, GraphMode::off, 1, 100);
  CHECK(off.summary().why_not == "trainer.cuda_graphs: off");
}

TEST_CASE("step graphs: auto's choice is matched on every rank, one with a refused capture too") {
  // Rank 1's first capture is refused (step 7); at step 14 both ranks still meet in the
  // choice's all-reduce, rank 0 keeping its graphs (8 ms against 10), and the next host
  // collective pairs with the next on the other rank.
  const int ids[] = {0, 1};
  std::vector<std::unique_ptr<Communicator>> comms =
      make_cpu_backend()->create_communicators(ids, nullptr);
  Summary::Graphs seen[2];
  double marker[2] = {0.0, 0.0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      test::GraphTestDevice device(0, 1, r == 1 ? "scale" : "");
      StepGraphs graphs(device, GraphMode::automatic, /*first_step=*/1, /*total_steps=*/40);
      Part part(device);
      double now = 0.0;
      for (std::int64_t step = 1; step <= 15; ++step) {
        graphs.begin_step(step, now, *comms[r]);
        graphs.run(kKey, [&](const StepGraphs::Layer& report) { part.enqueue(report); }, nullptr,
                   [](std::size_t) { return false; });
        now += step <= 6 ? 0.010 : step <= 8 ? 0.030 : 0.008;
      }
      std::array<double, 1> mine = {r + 1.0};
      comms[r]->all_reduce_host(mine);
      marker[r] = mine[0];
      seen[r] = graphs.summary();
    });
  for (std::thread& t : threads) t.join();
  CHECK(marker[0] == 3.0);
  CHECK(marker[1] == 3.0);
  CHECK(seen[0].used);
  CHECK(seen[0].eager_step_s == doctest::Approx(0.010));
  CHECK(seen[0].graph_step_s == doctest::Approx(0.008));  // rank 0's alone
  CHECK_FALSE(seen[1].used);
  CHECK(seen[1].why_not ==
        "a capture was refused, so every part runs as launched: scale cannot be captured (test "
        "device)");
}

namespace {

std::string bits(const StepMetrics& m) {
  const auto hex = [](double x) {
    std::uint64_t u = 0;
    std::memcpy(&u, &x, sizeof(u));
    return fmt::format("{:016x}", u);
  };
  return fmt::format("step {} loss {} acc {} norm {}", m.step, hex(m.loss), hex(m.accuracy),
                     hex(m.grad_norm));
}

struct Run {
  std::vector<std::string> steps;
  std::vector<float> params;
  Summary summary;
};

Run train(const Config& cfg, std::shared_ptr<Backend> backend) {
  auto data = std::make_shared<TokenDataset>(test::token_stream(700, cfg.model.context, 4));
  Trainer trainer(cfg, data, nullptr, nullptr, std::move(backend));
  Run run;
  std::mutex mutex;
  trainer.on_progress([&](const StepMetrics& m) {
    std::lock_guard lock(mutex);
    run.steps.push_back(bits(m));
  });
  run.summary = trainer.run();
  run.params = trainer.final_parameters();
  return run;
}

// small_gpt_config's GPT in buckets of 0.002 MB (512 floats): several, so that backward is cut.
Config graph_gpt(int devices) {
  Config cfg = test::small_gpt_config(devices, /*batch=*/4);
  cfg.model.attention = AttentionKind::materialized;
  cfg.trainer.bucket_cap_mb = 0.002;
  cfg.trainer.steps = 12;
  cfg.trainer.check_replicas_every = 4;
  return cfg;
}

}  // namespace

TEST_CASE("step graphs: a run with graphs trains bit for bit as one that launches every op") {
  const std::vector<std::pair<const char*, std::function<void(Config&)>>> variants = {
      {"2 workers, per-bucket updates", [](Config& cfg) { cfg.optimizer.clip_grad_norm = 0.0; }},
      {"2 workers, clipping, accumulate 2", [](Config& cfg) { cfg.trainer.accumulate_steps = 2; }},
      {"2 workers, ZeRO-1, bf16",
       [](Config& cfg) {
         cfg.trainer.zero = 1;
         cfg.trainer.precision = Precision::bf16;
       }},
      {"1 worker, a short last batch every epoch",
       [](Config& cfg) {
         cfg.trainer.devices = {0};
         cfg.data.batch_size = 20;  // 692 windows: 34 full batches and one of 12 per epoch
         cfg.trainer.steps = 40;
       }},
  };
  for (const auto& [name, change] : variants) {
    CAPTURE(std::string(name));
    Config cfg = graph_gpt(2);
    change(cfg);
    cfg.trainer.cuda_graphs = GraphMode::off;
    const Run launched = train(cfg, std::make_shared<test::GraphTestBackend>());
    cfg.trainer.cuda_graphs = GraphMode::on;
    auto backend = std::make_shared<test::GraphTestBackend>();
    const Run graphed = train(cfg, backend);
    CHECK(graphed.steps == launched.steps);
    CHECK(graphed.params == launched.params);
    CHECK(graphed.summary.replicas_identical);
    const Summary::Graphs& g = graphed.summary.graphs;
    CHECK(g.used);
    CHECK(g.why_not.empty());
    // Worker 0: forward and backward per micro-batch, from step 2 on; each key's first run
    // as launched (a key first seen in step 1 is captured at once), the rest replayed.
    const std::uint64_t parts =
        2u * static_cast<std::uint64_t>((cfg.trainer.steps - 1) * cfg.trainer.accumulate_steps);
    CHECK(g.launched + g.eager == parts);
    CHECK(g.eager <= g.captured);
    CHECK(g.refused == 0);
    CHECK(g.captured >= 2);
    CHECK(g.captured <= StepGraphs::kMaxPrograms);
    if (cfg.trainer.devices.size() > 1)
      CHECK(backend->counts->launches > g.launched);  // backward cut into segments
    CHECK_FALSE(launched.summary.graphs.used);
    CHECK(launched.summary.graphs.why_not == "trainer.cuda_graphs: off");
  }
}

TEST_CASE("step graphs: a refused backward capture keeps its parts eager, with the same bits") {
  Config cfg = graph_gpt(2);
  cfg.trainer.cuda_graphs = GraphMode::off;
  const Run launched = train(cfg, std::make_shared<test::GraphTestBackend>());
  cfg.trainer.cuda_graphs = GraphMode::on;
  auto backend = std::make_shared<test::GraphTestBackend>("causal_softmax_backward");
  const Run refused = train(cfg, backend);
  CHECK(refused.steps == launched.steps);
  CHECK(refused.params == launched.params);
  // Step 2's keys are new (run as launched); step 3 captures the forward of step 1's key, and
  // its backward's capture is refused: the forward graphs stay, every backward runs as
  // launched (Note [Step graphs]).
  const Summary::Graphs& g = refused.summary.graphs;
  CHECK(g.used);
  CHECK(g.why_not.empty());
  CHECK(g.refused == 2);  // worker 0's two backward keys
  CHECK(g.refusal == "causal_softmax_backward cannot be captured (test device)");
  CHECK(backend->counts->aborted == 4);  // each worker's two, each tried once
  CHECK(g.launched == 11 - 1);           // the forwards of steps 3 to 12
  CHECK(g.eager == 2 + 10);              // step 2's two parts, the backwards of steps 3 to 12

  // A capture refused before any succeeded: graphs off for the run.
  auto forward = std::make_shared<test::GraphTestBackend>("causal_softmax_forward");
  const Run off = train(cfg, forward);
  CHECK(off.params == launched.params);
  CHECK_FALSE(off.summary.graphs.used);
  CHECK(off.summary.graphs.why_not ==
        "a capture was refused, so every part runs as launched: causal_softmax_forward cannot "
        "be captured (test device)");

  // auto on a run long enough to time: whichever it keeps, the same bits, and both timings.
  cfg.trainer.steps = 16;
  cfg.trainer.cuda_graphs = GraphMode::off;
  const Run longer = train(cfg, std::make_shared<test::GraphTestBackend>());
  cfg.trainer.cuda_graphs = GraphMode::automatic;
  const Run timed = train(cfg, std::make_shared<test::GraphTestBackend>());
  CHECK(timed.params == longer.params);
  CHECK(timed.summary.graphs.eager_step_s > 0.0);
  CHECK(timed.summary.graphs.graph_step_s > 0.0);
}

TEST_CASE("step graphs: a worker lost mid-backward, the survivors go on with graphs, bit for bit") {
  // Worker 1 is lost in step 8's backward, between two of its buckets' collectives: the
  // survivors' new group captures its own graphs and ends as the run without graphs does.
  test::ScopedEnv fault("LOCKSTEP_FAULT", "1:8:lost:all-reduce");
  Config cfg = graph_gpt(3);
  cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
  cfg.trainer.snapshot_every = 3;
  cfg.trainer.check_replicas_every = 0;
  cfg.trainer.cuda_graphs = GraphMode::off;
  const Run launched = train(cfg, std::make_shared<test::GraphTestBackend>());
  cfg.trainer.cuda_graphs = GraphMode::on;
  const Run graphed = train(cfg, std::make_shared<test::GraphTestBackend>());
  CHECK(launched.summary.recoveries == 1);
  CHECK(graphed.summary.recoveries == 1);
  CHECK(graphed.summary.devices == std::vector<int>{0, 2});
  CHECK(graphed.summary.graphs.used);
  CHECK(graphed.params == launched.params);
}
