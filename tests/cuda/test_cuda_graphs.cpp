// Device graphs on the GPU (Note [Device graphs] in lockstep/device.hpp; Note [Step graphs] in
// src/train/step_graphs.hpp): a capture runs nothing, each launch runs its kernels on the
// memory of the moment with the bits of launching them one by one, and a refused call leaves
// the device as it was; a GPT's bf16 run with graphs (cuBLASLt's fused products, cuDNN's
// attention where built, collectives between backward's segments) trains bit for bit as the
// same run without them. Skip without a GPU.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "../train/trainer_fixtures.hpp"
#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

// y = gelu(x w^T) + x, then its LayerNorm: a product, an activation, an add and a LayerNorm.
struct Ops {
  static constexpr int kRows = 96, kC = 128;
  Device& d;
  DeviceArray<float> x, w, h, y, out, mean, rstd, gamma, beta;
  explicit Ops(Device& device)
      : d(device),
        x(on_device(d, random_floats(kRows * kC, 1))),
        w(on_device(d, random_floats(kC * kC, 2, -0.1, 0.1))),
        h(d, kRows * kC),
        y(d, kRows * kC),
        out(d, kRows * kC),
        mean(d, kRows),
        rstd(d, kRows),
        gamma(on_device(d, random_floats(kC, 3))),
        beta(on_device(d, random_floats(kC, 4))) {}
  void enqueue() {
    d.gemm(Transpose::no, Transpose::yes, kRows, kC, kC, 1.0f, x.data(), kC, w.data(), kC, 0.0f,
           h.data(), kC);
    d.activation_forward(Activation::gelu, h.data(), y.data(), h.size());
    d.add(y.data(), x.data(), y.data(), y.size());
    d.layernorm_forward(y.data(), gamma.data(), beta.data(), out.data(), mean.data(), rstd.data(),
                        kRows, kC);
  }
};

std::vector<float> inputs_of(std::uint64_t seed) { return random_floats(Ops::kRows * Ops::kC, seed); }

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuda graphs: a launch runs the captured kernels on the memory of the moment") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    REQUIRE(gpu->graphs_unsupported().empty());
    Ops ops(*gpu);
    gpu->begin_capture();
    ops.enqueue();
    const std::unique_ptr<DeviceGraph> graph = gpu->end_capture();
    REQUIRE(graph);
    CHECK(ops.out.download() == std::vector<float>(ops.out.size(), 0.0f));  // nothing ran
    for (const std::uint64_t seed : {11u, 12u}) {
      CAPTURE(seed);
      ops.x.upload(inputs_of(seed));
      graph->launch();
      const std::vector<float> replayed = ops.out.download();
      ops.enqueue();  // the same kernels, launched one by one
      CHECK(ops.out.download() == replayed);
    }
    CHECK(graph->valid());
  }

  TEST_CASE("cuda graphs: a host sync refuses the capture, and abort_capture leaves the device as it was") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    Ops ops(*gpu);
    ops.enqueue();
    const std::vector<float> before = ops.out.download();
    gpu->begin_capture();
    ops.enqueue();
    CHECK_THROWS(gpu->sum_squares(ops.out.data(), ops.out.size()));
    gpu->abort_capture();
    CHECK(ops.out.download() == before);  // the device works, and nothing of the capture ran
    gpu->begin_capture();  // and it captures again
    ops.enqueue();
    const std::unique_ptr<DeviceGraph> graph = gpu->end_capture();
    REQUIRE(graph);
    graph->launch();
    CHECK(ops.out.download() == before);
  }

  // Issue 40: copy_to_device went through the pinned staging chunks inside a capture, recording
  // their event in the graph, and the next copy's query of that event failed. Both copies now
  // refuse a capture before touching the chunks; after the abort they work as ever.
  TEST_CASE("cuda graphs: host copies refuse a capture, and the staging chunks stay usable") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const std::vector<float> values = random_floats(1000, 21);
    DeviceArray<float> buffer(*gpu, values.size());
    std::vector<float> back(values.size());
    for (const bool to_device : {true, false}) {
      CAPTURE(to_device);
      gpu->begin_capture();
      if (to_device)
        CHECK_THROWS_WITH(gpu->copy_to_device(buffer.data(), values.data(), 4 * values.size()),
                          doctest::Contains("copy_to_device cannot be captured"));
      else
        CHECK_THROWS_WITH(gpu->copy_to_host(back.data(), buffer.data(), 4 * values.size()),
                          doctest::Contains("copy_to_host cannot be captured"));
      gpu->abort_capture();
      gpu->copy_to_device(buffer.data(), values.data(), 4 * values.size());
      gpu->copy_to_host(back.data(), buffer.data(), 4 * values.size());
      CHECK(back == values);
    }
  }
}

// It builds cuDNN's attention graphs where the build has them: run with the cuDNN cases,
// last (Note [cuDNN plan cache], test_cudnn_attention.cpp).
TEST_SUITE("cuda cudnn") {
  TEST_CASE("cuda graphs: a GPT's bf16 run with graphs trains bit for bit as one without") {
    auto cuda = cuda_or_skip();
    if (!cuda) return;
    auto train = std::make_shared<TokenDataset>(token_stream(4000, 8, 1));
    std::vector<std::vector<int>> lists = {{0}, {0, 0, 0, 0}};
    if (cuda->devices().size() >= 2) lists.push_back({0, 1});
    for (const std::vector<int>& devices : lists) {
      CAPTURE(devices.size());
      Config cfg = small_gpt_config(static_cast<int>(devices.size()), /*batch=*/4);
      cfg.model.d_model = 128;
      cfg.model.n_head = 4;
      cfg.trainer.backend = BackendKind::cuda;
      cfg.trainer.devices = devices;
      cfg.trainer.precision = Precision::bf16;
      cfg.trainer.bucket_cap_mb = 0.25;  // several buckets: backward cut into segments
      cfg.trainer.steps = 12;
      std::vector<float> params[2];
      for (const GraphMode mode : {GraphMode::off, GraphMode::on}) {
        cfg.trainer.cuda_graphs = mode;
        Trainer trainer(cfg, train, nullptr);
        const Summary s = trainer.run();
        CHECK(s.replicas_identical);
        if (mode == GraphMode::on) {
          CHECK(s.graphs.why_not == "");
          CHECK(s.graphs.used);
          // Forward and backward of steps 2 to 12: replayed, or run as launched where the key
          // was new (Note [Step graphs]).
          CHECK(s.graphs.launched + s.graphs.eager == 22);
          CHECK(s.graphs.refused == 0);
        }
        params[mode == GraphMode::on] = trainer.final_parameters();
      }
      CHECK(params[1] == params[0]);
    }
  }
}
