// The GPT layers: finite-difference checks of each layer's backward and of a whole tiny GPT
// through a Replica (including the tied LM head); the parameter layout, names and GPT-2 init;
// causal masking; and the transformer kernels' own closed forms on the CPU device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lockstep/model.hpp"

namespace {

using lockstep::DeviceArray;
using lockstep::Model;
using namespace lockstep::test;


void check_layer(const LayerGradients& g, bool input_grad = true) {
  std::string miss = mismatch(g.fd_params, g.params);
  CHECK_MESSAGE(miss.empty(), "parameters: ", miss);
  if (!input_grad) return;
  miss = mismatch(g.fd_input, g.input);
  CHECK_MESSAGE(miss.empty(), "input: ", miss);
}

constexpr lockstep::GptSpec kTiny{.vocab_size = 11, .context = 5, .n_layer = 2, .n_head = 2,
                                  .d_model = 8};

}  // namespace

TEST_SUITE("gradcheck") {
  TEST_CASE("gpt embedding: wte and wpe, repeated tokens accumulate") {
    const int vocab = 7, t = 4, c = 3, batch = 3;
    const auto layer = lockstep::make_embedding(vocab, t, c);
    auto tokens = random_tokens(std::size_t(batch) * t, vocab, 1);
    tokens[0] = tokens[5] = 2.0f;  // one token twice
    const auto g = layer_gradients(*layer, batch, random_floats(layer->param_count(), 2),
                                   tokens, 3, /*input_grad=*/false);
    check_layer(g, false);
  }

  TEST_CASE("gpt block: every parameter and the input") {
    const int t = 4, c = 8, heads = 2, batch = 2;
    const auto layer = lockstep::make_block(t, c, heads, /*n_layer=*/2);
    // Weights near GPT-2's scale make attention nearly uniform; larger ones exercise it.
    auto params = random_floats(layer->param_count(), 4, -0.5, 0.5);
    const auto g = layer_gradients(*layer, batch, params,
                                   random_floats(std::size_t(batch) * t * c, 5, -2.0, 2.0), 6);
    check_layer(g);
  }

  // The tiled attention's backward (Note [Tiled attention]) inside a block; several tiles are
  // checked on the op alone (tests/cpu/test_attention.cpp), where the objective is less noisy.
  TEST_CASE("gpt block with fused attention: every parameter and the input") {
    const int t = 4, c = 8, heads = 2, batch = 2;
    const auto layer =
        lockstep::make_block(t, c, heads, /*n_layer=*/2, lockstep::AttentionKind::fused);
    auto params = random_floats(layer->param_count(), 4, -0.5, 0.5);
    const auto g = layer_gradients(*layer, batch, params,
                                   random_floats(std::size_t(batch) * t * c, 5, -2.0, 2.0), 6);
    check_layer(g);
  }

  TEST_CASE("gpt block as a first layer (no input gradient): ln_1 still gets its gradients") {
    const int t = 3, c = 8, batch = 2;
    const auto layer = lockstep::make_block(t, c, 2, 1);
    const auto g = layer_gradients(*layer, batch, random_floats(layer->param_count(), 21, -0.5, 0.5),
                                   random_floats(std::size_t(batch) * t * c, 22, -2.0, 2.0), 23,
                                   /*input_grad=*/false);
    check_layer(g, false);
  }

  TEST_CASE("gpt block with one head and one position") {
    const auto layer = lockstep::make_block(1, 4, 1, 1);
    const auto g = layer_gradients(*layer, 3, random_floats(layer->param_count(), 7, -0.5, 0.5),
                                   random_floats(12, 8, -2.0, 2.0), 9);
    check_layer(g);
  }

  TEST_CASE("gpt final layernorm") {
    const int t = 3, c = 6, batch = 2;
    const auto layer = lockstep::make_layernorm(t, c);
    const auto g = layer_gradients(*layer, batch, random_floats(layer->param_count(), 10),
                                   random_floats(std::size_t(batch) * t * c, 11, -2.0, 2.0), 12);
    check_layer(g);
  }

  TEST_CASE("gpt tied lm head, on its own: wte and the input") {
    const int vocab = 64, t = 3, c = 4, batch = 2;  // a multiple of 64: no padding
    const auto layer = lockstep::make_tied_lm_head(0, vocab, t, c);
    CHECK(layer->param_count() == 0);
    // The head reads wte as its parameters.
    const auto g = layer_gradients(*layer, batch, random_floats(std::size_t(vocab) * c, 13),
                                   random_floats(std::size_t(batch) * t * c, 14), 15);
    check_layer(g);
  }

  TEST_CASE("gpt tied lm head pads the vocabulary to 64: -inf logits, no loss, no gradient") {
    const int vocab = 6, padded = 64, t = 3, c = 4, batch = 2, rows = batch * t;
    const auto layer = lockstep::make_tied_lm_head(0, vocab, t, c);
    REQUIRE(layer->out_features() == t * padded);
    CHECK(layer->vocab_padding() == padded - vocab);
    auto dev = lockstep::make_cpu_device(0, 1);
    const auto wte = random_floats(std::size_t(vocab) * c, 20), x = random_floats(rows * c, 21);
    const auto labels = random_labels(rows, vocab, 22);
    DeviceArray<float> saved(*dev, layer->workspace_size(batch)), logits(*dev, rows * padded);
    DeviceArray<float> dlogits(*dev, rows * padded), din(*dev, rows * c);
    auto wd = on_device(*dev, wte), xd = on_device(*dev, x);
    auto yd = on_device(*dev, labels);
    auto dwte = on_device(*dev, std::vector<float>(wte.size(), 0.0f));
    const lockstep::LayerWorkspace ws{saved.data(), nullptr};
    layer->forward(*dev, wd.data(), xd.data(), logits.data(), batch, ws);
    const lockstep::LossStats s =
        dev->softmax_cross_entropy(logits.data(), yd.data(), rows, padded, dlogits.data(), 1.0f);
    layer->backward(*dev, wd.data(), dwte.data(), xd.data(), logits.data(), dlogits.data(),
                    din.data(), batch, ws);
    // Against the unpadded model in double: z = x wte^T, p = softmax(z), dz = p - onehot.
    const auto z = logits.download(), dz = dlogits.download();
    const auto got_dwte = dwte.download(), got_din = din.download();
    std::vector<double> want_dwte(wte.size(), 0.0), want_din(x.size(), 0.0);
    double loss = 0.0;
    for (int r = 0; r < rows; ++r) {
      double zr[vocab], sum = 0.0, zmax = -INFINITY;
      for (int j = 0; j < vocab; ++j) {
        zr[j] = 0.0;
        for (int k = 0; k < c; ++k) zr[j] += double(x[r * c + k]) * wte[j * c + k];
        CHECK(z[r * padded + j] == doctest::Approx(zr[j]).epsilon(1e-6));
        zmax = std::max(zmax, zr[j]);
      }
      for (int j = vocab; j < padded; ++j) CHECK(z[r * padded + j] == -INFINITY);
      for (int j = 0; j < vocab; ++j) sum += std::exp(zr[j] - zmax);
      loss += std::log(sum) + zmax - zr[labels[r]];
      for (int j = 0; j < vocab; ++j) {
        const double d = std::exp(zr[j] - zmax) / sum - (j == labels[r] ? 1.0 : 0.0);
        CHECK(dz[r * padded + j] == doctest::Approx(d).epsilon(1e-5));
        for (int k = 0; k < c; ++k) {
          want_dwte[j * c + k] += d * x[r * c + k];
          want_din[r * c + k] += d * wte[j * c + k];
        }
      }
      for (int j = vocab; j < padded; ++j) CHECK(dz[r * padded + j] == 0.0f);
    }
    CHECK(s.loss_sum == doctest::Approx(loss).epsilon(1e-6));
    for (std::size_t i = 0; i < want_dwte.size(); ++i)
      CHECK(got_dwte[i] == doctest::Approx(want_dwte[i]).epsilon(1e-5));
    for (std::size_t i = 0; i < want_din.size(); ++i)
      CHECK(got_din[i] == doctest::Approx(want_din[i]).epsilon(1e-5));
  }

  TEST_CASE("a tiny GPT through a Replica: mean next-token cross-entropy, every parameter") {
    const Model model = Model::gpt(kTiny);
    auto dev = lockstep::make_cpu_device(0, 2);
    const int batch = 2, t = kTiny.context, v = kTiny.vocab_size;
    lockstep::Replica replica(*dev, model, /*max_batch=*/3);
    std::vector<float> params = model.initial_parameters(3);
    // Away from GPT-2's tiny init, so attention is far from uniform. The residual stream is then
    // still small, so the LayerNorms see a large 1/std and the loss curves sharply: a step of
    // 1e-3 (not the layer checks' 1e-2) keeps the truncation error below the tolerance.
    for (float& p : params) p *= 2.0f;
    auto xd = on_device(*dev, random_tokens(std::size_t(batch) * t, v, 16));
    auto yd = on_device(*dev, random_labels(std::size_t(batch) * t, v, 17));
    // Rows of the padded vocabulary (11 -> 64): the padding must not change the gradients.
    const int padded = model.outputs() / t;
    DeviceArray<float> dlogits(*dev, std::size_t(batch) * t * padded);
    const int rows = batch * t;
    const auto loss = [&](float* grad) {
      replica.load_parameters(params);
      const float* logits = replica.forward(xd.data(), batch);
      return dev->softmax_cross_entropy(logits, yd.data(), rows, padded, grad, 1.0f / rows)
                 .loss_sum /
             rows;
    };
    replica.zero_grads();
    loss(dlogits.data());
    std::vector<std::size_t> ready;
    replica.backward(xd.data(), dlogits.data(), batch, [&](std::size_t i) { ready.push_back(i); });
    // ln_f, blocks last to first, then the embedding (its wte also collects the head's gradient).
    CHECK(ready == std::vector<std::size_t>{3, 2, 1, 0});
    const auto analytic = replica.gradients();
    std::vector<double> fd;
    for (std::size_t i = 0; i < params.size(); ++i)
      fd.push_back(central_difference(params, i, [&] { return loss(nullptr); }, 1e-3f));
    const std::string miss = mismatch(fd, analytic);
    CHECK_MESSAGE(miss.empty(), miss);
  }
}

TEST_SUITE("model") {
  TEST_CASE("gpt layout: nanoGPT names and shapes, reversed offsets, tied head, counts") {
    const Model model = Model::gpt(kTiny);
    const std::int64_t c = kTiny.d_model, v = kTiny.vocab_size, t = kTiny.context;
    REQUIRE(model.layers().size() == 5);  // embedding, 2 blocks, ln_f, head
    CHECK(model.inputs() == t);
    CHECK(model.outputs() == t * 64);  // the vocabulary padded to 64: Note [Padded vocabulary]
    CHECK(model.layers()[4]->vocab_padding() == 64 - v);
    const std::size_t block = 12 * c * c + 13 * c;  // 4 LN vectors, c_attn, c_proj, c_fc, c_proj
    CHECK(model.param_count() == std::size_t((v + t) * c + 2 * block + 2 * c));
    CHECK(model.layers()[4]->tied_to() == 0);
    CHECK(model.read_offset(4) == model.param_offset(0));
    CHECK(model.param_offset(3) == 0);  // ln_f first: the head has no parameters of its own
    const auto tensors = model.param_tensors();
    REQUIRE(tensors.size() == 2 + 2 * 12 + 2);
    CHECK(tensors[0].name == "transformer.wte.weight");
    CHECK(tensors[0].shape == std::vector<std::int64_t>{v, c});
    CHECK(tensors[0].offset == model.param_offset(0));
    CHECK(tensors[1].name == "transformer.wpe.weight");
    CHECK(tensors[4].name == "transformer.h.0.attn.c_attn.weight");
    CHECK(tensors[4].shape == std::vector<std::int64_t>{3 * c, c});
    CHECK(tensors[12].name == "transformer.h.0.mlp.c_proj.weight");
    CHECK(tensors[12].shape == std::vector<std::int64_t>{c, 4 * c});
    CHECK(tensors.back().name == "transformer.ln_f.bias");
    std::size_t total = 0;
    for (const auto& tensor : tensors) total += tensor.numel();
    CHECK(total == model.param_count());
  }

  TEST_CASE("gpt init: GPT-2's std 0.02, residual projections scaled by 1/sqrt(2 n_layer)") {
    const lockstep::GptSpec spec{.vocab_size = 64, .context = 16, .n_layer = 4, .n_head = 2,
                                 .d_model = 32};
    const Model model = Model::gpt(spec);
    const auto p = model.initial_parameters(5);
    const auto stddev = [&](const std::string& name) {
      for (const auto& t : model.param_tensors())
        if (t.name == name) {
          double s = 0.0;
          for (std::size_t i = 0; i < t.numel(); ++i) s += double(p[t.offset + i]) * p[t.offset + i];
          return std::sqrt(s / double(t.numel()));
        }
      FAIL("no tensor ", name);
      return 0.0;
    };
    CHECK(stddev("transformer.wte.weight") == doctest::Approx(0.02).epsilon(0.05));
    CHECK(stddev("transformer.h.1.mlp.c_fc.weight") == doctest::Approx(0.02).epsilon(0.05));
    CHECK(stddev("transformer.h.1.attn.c_proj.weight") ==
          doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.1));
    CHECK(stddev("transformer.h.3.mlp.c_proj.weight") ==
          doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
    CHECK(stddev("transformer.h.0.attn.c_attn.bias") == 0.0);
    CHECK(stddev("transformer.h.2.ln_1.bias") == 0.0);
    CHECK(stddev("transformer.ln_f.weight") == 1.0);
    CHECK(p == Model::gpt(spec).initial_parameters(5));
    CHECK(p != model.initial_parameters(6));
  }

  TEST_CASE("gpt is causal: a later token never changes earlier logits") {
    const Model model = Model::gpt(kTiny);
    auto dev = lockstep::make_cpu_device(0, 1);
    lockstep::Replica replica(*dev, model, 1);
    replica.load_parameters(model.initial_parameters(9));
    auto tokens = random_tokens(kTiny.context, kTiny.vocab_size, 18);
    const auto logits_of = [&] {
      auto xd = on_device(*dev, tokens);
      std::vector<float> out(static_cast<std::size_t>(model.outputs()));
      dev->copy_to_host(out.data(), replica.forward(xd.data(), 1), out.size() * sizeof(float));
      return out;
    };
    const auto before = logits_of();
    tokens.back() = static_cast<float>((static_cast<int>(tokens.back()) + 1) % kTiny.vocab_size);
    const auto after = logits_of();
    const std::size_t prefix = std::size_t(kTiny.context - 1) * (model.outputs() / kTiny.context);
    CHECK(std::vector<float>(before.begin(), before.begin() + prefix) ==
          std::vector<float>(after.begin(), after.begin() + prefix));
    CHECK(before != after);
  }

  TEST_CASE("gpt rejects bad shapes") {
    CHECK_THROWS_AS(Model::gpt({.vocab_size = 10, .context = 4, .n_layer = 1, .n_head = 3,
                                .d_model = 8}),
                    std::invalid_argument);
    CHECK_THROWS_AS(Model::gpt({.vocab_size = 0}), std::invalid_argument);
    CHECK_THROWS_AS(Model::gpt({.vocab_size = (1 << 24) + 1}), std::invalid_argument);
  }
}

TEST_SUITE("model") {
  TEST_CASE("gpt FLOPs per token: GPT-2 124M, as nanoGPT's estimate counts them") {
    const lockstep::GptSpec gpt2{.vocab_size = 50257, .context = 1024, .n_layer = 12,
                                 .n_head = 12, .d_model = 768};
    const Model model = Model::gpt(gpt2);
    CHECK(model.param_count() == 124439808);  // GPT-2 small with a tied head
    // 6 x (parameters - wpe) + 12 x layers x channels x context.
    CHECK(lockstep::gpt_flops_per_token(gpt2) ==
          6.0 * (124439808.0 - 1024.0 * 768.0) + 12.0 * 12 * 768 * 1024);
  }

  TEST_CASE("peak FLOP/s by device name, fp32, TF32 and bf16 - unknown devices have none") {
    using lockstep::Precision;
    CHECK(lockstep::peak_flops("NVIDIA H200", Precision::tf32).value() == doctest::Approx(494.7e12));
    CHECK(lockstep::peak_flops("NVIDIA H200", Precision::fp32).value() == doctest::Approx(67e12));
    CHECK(lockstep::peak_flops("NVIDIA H100 PCIe", Precision::tf32).value() == doctest::Approx(378e12));
    CHECK(lockstep::peak_flops("NVIDIA A100-SXM4-80GB", Precision::tf32).value() == doctest::Approx(156e12));
    CHECK(lockstep::peak_flops("NVIDIA A10G", Precision::fp32).value() == doctest::Approx(31.2e12));
    CHECK_FALSE(lockstep::peak_flops("cpu", Precision::fp32).has_value());
    CHECK(lockstep::peak_flops("NVIDIA H200", Precision::bf16).value() == doctest::Approx(989.4e12));
    CHECK(lockstep::peak_flops("NVIDIA H100 80GB HBM3", Precision::bf16).value() == doctest::Approx(989.4e12));
    CHECK(lockstep::peak_flops("NVIDIA A100-SXM4-80GB", Precision::bf16).value() == doctest::Approx(312e12));
    CHECK_FALSE(lockstep::peak_flops("Tesla V100-SXM2-16GB", Precision::bf16).has_value());
    CHECK_FALSE(lockstep::peak_flops("cpu", Precision::bf16).has_value());
  }
}

TEST_SUITE("model") {
  TEST_CASE("gpt spec text: round trip, and every malformed description is refused") {
    const lockstep::GptSpec spec{.vocab_size = 50257, .context = 1024, .n_layer = 12,
                                 .n_head = 12, .d_model = 768};
    const std::string text = lockstep::to_string(spec);
    CHECK(text == "gpt vocab_size=50257 context=1024 n_layer=12 n_head=12 d_model=768");
    const lockstep::GptSpec back = lockstep::parse_gpt_spec(text);
    CHECK(lockstep::to_string(back) == text);
    for (const char* bad : {"", "mlp", "gpt vocab_size=10", "gpt vocab_size=x context=1 n_layer=1 "
                            "n_head=1 d_model=1", "gpt vocab_size=0 context=1 n_layer=1 n_head=1 "
                            "d_model=1", "gpt context=1 vocab_size=1 n_layer=1 n_head=1 d_model=1",
                            "gpt vocab_size=1 context=1 n_layer=1 n_head=1 d_model=1 extra"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(lockstep::parse_gpt_spec(bad), std::invalid_argument);
    }
  }
}
