// Generation with a key/value cache on the GPU (Note [KV cache] in src/model/kv_cache.cpp): the
// softmax of the newest rows against the CPU device, element by element (Note [Comparing with
// the CPU] in gpu_vs_cpu.hpp); decode's logits against forward's on the GPU and against the
// CPU's decode; greedy sampling the same with and without the cache, GPT-2 and the Llama
// family. Skip without a GPU.
#include <doctest/doctest.h>

#include <vector>

#include "gpu_vs_cpu.hpp"
#include "lockstep/generate.hpp"
#include "../model/kv_cache_check.hpp"

using namespace lockstep;
using namespace lockstep::test;

TEST_SUITE("cuda") {
  TEST_CASE("cuda: causal_softmax_tail_forward against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (auto [count, rows, cols] : {std::tuple{1, 1, 1}, {6, 1, 300}, {4, 3, 70}, {2, 64, 64}}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const std::size_t n = std::size_t(count) * rows * cols;
      const auto s = random_floats(n, 910 + n, -4.0, 4.0);
      compare(*gpu, [&](Device& d) {
        auto sd = on_device(d, s);
        auto p = poisoned(d, n);
        d.causal_softmax_tail_forward(sd.data(), p.data(), count, rows, cols, 0.3f);
        d.causal_softmax_tail_forward(sd.data(), sd.data(), count, rows, cols, 0.3f);  // in place
        return Outputs{p.download(), sd.download()};
      }, softmax_tolerance(cols, false).p);
    }
  }

  TEST_CASE("cuda: decode's logits are forward's and the CPU's, and greedy sampling draws the same cached") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    const std::vector<int> tokens{3, 17, 5, 39, 0, 22, 8, 8, 31, 2, 14, 27};
    const std::vector<int> steps{4, 1, 1, 2, 1, 1, 1, 1};
    for (const KvCase& c : kv_cases()) {
      CAPTURE(c.name);
      const Model model = Model::gpt(c.spec);
      const std::vector<float> params = spread_parameters(model, 5);
      const std::size_t row = std::size_t(model.outputs() / c.spec.context);
      const auto on_gpu = forward_and_decode(*gpu, model, params, tokens, steps);
      const auto on_cpu = forward_and_decode(*cpu, model, params, tokens, steps);
      // cuBLAS's sums in their own order (TF32 is off for fp32): d_model terms and more.
      check_close(on_gpu[1], on_gpu[0], {1e-5, 1e-5, row});
      check_close(on_gpu[1], on_cpu[1], {1e-5, 1e-5, row});

      Replica replica(*gpu, model, 1);
      replica.load_parameters(params);
      SamplingOptions opt{.tokens = 20, .temperature = 0.0};
      const std::vector<int> prompt{1, 30, 7, 12};
      const std::vector<int> cached = generate(replica, prompt, opt);
      opt.kv_cache = false;
      CHECK(cached == generate(replica, prompt, opt));
    }
  }
}
