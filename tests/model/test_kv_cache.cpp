// Generation with a key/value cache (Note [KV cache] in src/model/kv_cache.cpp), GPT-2 and the
// Llama family: the softmax of the newest rows, decode's logits against forward's, greedy
// sampling the same with and without the cache, and stop tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kv_cache_check.hpp"
#include "lockstep/generate.hpp"
#include "../compare.hpp"
#include "../random_data.hpp"

using namespace lockstep;
using namespace lockstep::test;

TEST_SUITE("generate") {
  TEST_CASE("causal_softmax_tail_forward: the causal softmax's last rows, bit for bit") {
    auto dev = make_cpu_device(0, 1);
    const int count = 3, T = 7;
    const std::vector<float> s = random_floats(std::size_t(count) * T * T, 71, -3.0, 3.0);
    std::vector<float> square(s.size());
    dev->causal_softmax_forward(s.data(), square.data(), count, T, 0.5f);
    for (const int rows : {1, 2, T}) {
      CAPTURE(rows);
      std::vector<float> tail_in, want;
      for (int m = 0; m < count; ++m) {
        const auto from = std::size_t(m) * T * T + std::size_t(T - rows) * T;
        tail_in.insert(tail_in.end(), s.begin() + from, s.begin() + from + rows * T);
        want.insert(want.end(), square.begin() + from, square.begin() + from + rows * T);
      }
      std::vector<float> got(tail_in.size());
      dev->causal_softmax_tail_forward(tail_in.data(), got.data(), count, rows, T, 0.5f);
      CHECK(got == want);
    }
    std::vector<float> p(8);
    CHECK_THROWS_AS(dev->causal_softmax_tail_forward(p.data(), p.data(), 1, 4, 2, 1.0f),
                    std::invalid_argument);
  }

  TEST_CASE("kv cache: decode's logits are forward's, prefilled whole or in pieces") {
    auto dev = make_cpu_device(0, 2);
    const std::vector<int> tokens{3, 17, 5, 39, 0, 22, 8, 8, 31, 2, 14, 27};  // the context: 12
    for (const KvCase& c : kv_cases()) {
      CAPTURE(c.name);
      const Model model = Model::gpt(c.spec);
      const std::vector<float> params = spread_parameters(model, 5);
      for (const std::vector<int>& steps : {std::vector<int>{3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                            std::vector<int>{1, 4, 2, 1, 4}, std::vector<int>{12}}) {
        std::vector<int> prefix = tokens;
        int n = 0;
        for (int k : steps) n += k;
        prefix.resize(std::size_t(n));
        const auto both = forward_and_decode(*dev, model, params, prefix, steps);
        // Forward's products on other shapes: sums of up to d_model terms, in other orders.
        check_close(both[1], both[0], {1e-5, 1e-5, std::size_t(model.outputs() / c.spec.context)});
      }
    }
  }

  TEST_CASE("kv cache: greedy sampling draws the same tokens with and without it") {
    auto dev = make_cpu_device(0, 2);
    for (const KvCase& c : kv_cases()) {
      CAPTURE(c.name);
      const Model model = Model::gpt(c.spec);
      Replica replica(*dev, model, 1);
      replica.load_parameters(spread_parameters(model, 6));
      // 4 + 20 tokens: the window slides past the context (12) for the last 12.
      SamplingOptions opt{.tokens = 20, .temperature = 0.0};
      const std::vector<int> prompt{1, 30, 7, 12};
      const std::vector<int> cached = generate(replica, prompt, opt);
      opt.kv_cache = false;
      const std::vector<int> uncached = generate(replica, prompt, opt);
      CHECK(cached.size() == 20);
      CHECK(cached == uncached);
      // Drawn at temperature 1 the same way too (the same logits to rounding, the same draws).
      opt = {.tokens = 10, .temperature = 1.0, .seed = 3};
      const std::vector<int> drawn = generate(replica, prompt, opt);
      opt.kv_cache = false;
      CHECK(drawn == generate(replica, prompt, opt));
    }
  }

  TEST_CASE("generate stops at a stop token, which it neither returns nor passes on") {
    auto dev = make_cpu_device(0, 1);
    const Model model = Model::gpt(kv_cases()[1].spec);
    Replica replica(*dev, model, 1);
    replica.load_parameters(spread_parameters(model, 7));
    SamplingOptions opt{.tokens = 8, .temperature = 0.0};
    const std::vector<int> prompt{4, 9};
    const std::vector<int> all = generate(replica, prompt, opt);
    REQUIRE(all.size() == 8);
    // Stop at the first token that differs from the first one drawn (a greedy model may repeat).
    const auto other = std::find_if(all.begin(), all.end(), [&](int t) { return t != all[0]; });
    REQUIRE(other != all.end());
    for (const bool cache : {true, false}) {
      CAPTURE(cache);
      opt.kv_cache = cache;
      opt.stop_tokens = {*other, 1000};
      int seen = 0;
      const std::vector<int> stopped = generate(replica, prompt, opt, [&](int) { ++seen; });
      CHECK(stopped == std::vector<int>(all.begin(), other));
      CHECK(seen == static_cast<int>(stopped.size()));
      opt.stop_tokens = {all[0]};
      CHECK(generate(replica, prompt, opt).empty());
    }
  }

  TEST_CASE("kv cache: only a decoder decodes, and only within its context") {
    auto dev = make_cpu_device(0, 1);
    const Model mlp = Model::mlp({.inputs = 4, .hidden = {8}, .classes = 3});
    CHECK_THROWS_AS(KvCache(*dev, mlp), std::invalid_argument);
    const Model model = Model::gpt(kv_cases()[0].spec);
    Replica replica(*dev, model, 1);
    KvCache cache(*dev, model);
    DeviceArray<float> ids(*dev, 12);
    CHECK_THROWS_AS(replica.decode(ids.data(), 10, 3, cache), std::invalid_argument);
    CHECK_THROWS_AS(replica.decode(ids.data(), 0, 0, cache), std::invalid_argument);
  }
}
