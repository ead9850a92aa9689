// Sampling: the token draw against closed-form probabilities, greedy decoding, reproducibility,
// the sliding window, and a tiny GPT that learns a repeating pattern and then continues it.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lockstep/generate.hpp"

namespace {

using lockstep::DeviceArray;
using lockstep::Model;
using lockstep::sample_token;

constexpr lockstep::GptSpec kSpec{.vocab_size = 8, .context = 6, .n_layer = 1, .n_head = 2,
                                  .d_model = 16};

}  // namespace

TEST_SUITE("generate") {
  TEST_CASE("sample_token: greedy, top-k and the softmax's probabilities") {
    std::uint64_t rng = 1;
    const std::vector<float> logits{0.0f, 5.0f, 4.0f, 1.0f};
    CHECK(sample_token(logits, 0.0, 0, rng) == 1);
    CHECK(sample_token(logits, 10.0, 1, rng) == 1);
    for (int i = 0; i < 200; ++i) {
      const int t = sample_token(logits, 3.0, 2, rng);
      CHECK((t == 1 || t == 2));
    }
    // p(1) = 3 / (1 + 3) for logits log 1, log 3 at temperature 1; at temperature 2 the
    // logits halve: p(1) = sqrt(3) / (1 + sqrt(3)).
    const std::vector<float> two{0.0f, static_cast<float>(std::log(3.0))};
    for (const double temperature : {1.0, 2.0}) {
      const int draws = 20000;
      int ones = 0;
      for (int i = 0; i < draws; ++i) ones += sample_token(two, temperature, 0, rng);
      const double p = std::pow(3.0, 1.0 / temperature) / (1.0 + std::pow(3.0, 1.0 / temperature));
      CHECK(double(ones) / draws == doctest::Approx(p).epsilon(0.03));
    }
    CHECK_THROWS_AS(sample_token(two, -1.0, 0, rng), std::invalid_argument);
    CHECK_THROWS_AS(sample_token({}, 1.0, 0, rng), std::invalid_argument);
  }

  TEST_CASE("generate: reproducible by seed, greedy equals argmax, windows slide past context") {
    const Model model = Model::gpt(kSpec);
    auto dev = lockstep::make_cpu_device(0, 1);
    lockstep::Replica replica(*dev, model, 1);
    replica.load_parameters(model.initial_parameters(2));
    const std::vector<int> prompt{1, 2, 3};
    const lockstep::SamplingOptions opt{.tokens = 10, .temperature = 1.0, .top_k = 0, .seed = 4};
    const auto a = lockstep::generate(replica, prompt, opt);
    CHECK(a.size() == 10);  // 13 tokens in all: the window slides past context = 6
    CHECK(a == lockstep::generate(replica, prompt, opt));
    int seen = 0;
    lockstep::generate(replica, prompt, opt, [&](int t) { CHECK(t == a[seen++]); });
    CHECK(seen == 10);
    auto other = opt;
    other.seed = 5;
    CHECK(a != lockstep::generate(replica, prompt, other));
    CHECK_THROWS_AS(lockstep::generate(replica, std::vector<int>{}, opt), std::invalid_argument);
    CHECK_THROWS_AS(lockstep::generate(replica, std::vector<int>{8}, opt), std::invalid_argument);
  }

  TEST_CASE("a tiny GPT trained on a repeating pattern continues it greedily") {
    const Model model = Model::gpt(kSpec);
    auto dev = lockstep::make_cpu_device(0, 2);
    const int batch = 4, t = kSpec.context, rows = batch * t;
    lockstep::Replica replica(*dev, model, batch);
    replica.load_parameters(model.initial_parameters(3));
    DeviceArray<float> m(*dev, model.param_count()), v(*dev, model.param_count());
    const int width = model.outputs() / t;  // the vocabulary padded to 64
    DeviceArray<float> x(*dev, rows), dlogits(*dev, std::size_t(rows) * width);
    DeviceArray<std::int32_t> y(*dev, rows);
    // The stream 0 1 2 3 4 0 1 2 3 4 ...: windows start at every phase.
    std::vector<float> xs;
    std::vector<std::int32_t> ys;
    for (int b = 0; b < batch; ++b)
      for (int p = 0; p < t; ++p) {
        xs.push_back(static_cast<float>((b + p) % 5));
        ys.push_back((b + p + 1) % 5);
      }
    x.upload(xs);
    y.upload(ys);
    double loss = 0.0;
    for (int step = 1; step <= 150; ++step) {
      replica.zero_grads();
      loss = dev->softmax_cross_entropy(replica.forward(x.data(), batch), y.data(), rows,
                                        width, dlogits.data(), 1.0f / rows).loss_sum / rows;
      replica.backward(x.data(), dlogits.data(), batch);
      dev->adamw_step({}, 1e-2f, step, replica.params(), replica.grads(), m.data(), v.data(),
                      model.param_count(), nullptr, nullptr);
    }
    CHECK(loss < 0.05);
    const auto out = lockstep::generate(replica, std::vector<int>{2, 3}, {.tokens = 12, .temperature = 0.0});
    CHECK(out == std::vector<int>{4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0});
  }
}
