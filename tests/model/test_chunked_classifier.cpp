// The LM head fused with the loss, a chunk of rows at a time (Note [Chunked classifier] in
// src/model/lm_head.cpp), against the head that writes every logit and the loss over them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/elementwise_math.hpp"
#include "lockstep/model.hpp"
#include "../random_data.hpp"

namespace {

using lockstep::Device;
using lockstep::DeviceArray;
using lockstep::GptSpec;
using lockstep::LossStats;
using lockstep::Model;
using lockstep::Precision;
using lockstep::Replica;
using namespace lockstep::test;

// 3 x 100 positions: a chunk of 256 rows and one of 44 (no chunk count divides 300); vocab 70
// padded to 128.
constexpr int kBatch = 3;

GptSpec spec_of(bool llama) {
  GptSpec s{.vocab_size = 70, .context = 100, .n_layer = 1, .n_head = 2, .d_model = 16};
  if (llama) {  // an untied head, as small_llama_config
    s.norm = lockstep::NormKind::rmsnorm;
    s.norm_eps = 1e-6;
    s.positions = lockstep::PositionKind::rope;
    s.mlp = lockstep::MlpKind::swiglu;
    s.intermediate_size = 40;
    s.n_kv_head = 1;
    s.qkv_bias = s.proj_bias = s.tie_embeddings = false;
  }
  return s;
}

// Labels over the real vocabulary, every fifth one kIgnoreLabel (a masked target).
std::vector<std::int32_t> masked_labels(int rows, int vocab) {
  std::vector<std::int32_t> y = random_labels(std::size_t(rows), vocab, 11);
  for (int r = 0; r < rows; r += 5) y[std::size_t(r)] = lockstep::kIgnoreLabel;
  return y;
}

struct Pass {
  LossStats loss;
  std::vector<float> grads;
};

// The unchunked head: every logit, the loss over them, and backward from their gradient (bf16:
// the fused classifier over the bf16 logits in place, as training did before).
Pass unchunked(Device& dev, Replica& r, const float* x, const std::int32_t* y, int rows,
               int classes, float scale) {
  DeviceArray<LossStats> stats(dev, 1);
  r.zero_grads();
  if (const std::uint16_t* logits16 = r.forward_bf16(x, kBatch)) {
    dev.softmax_cross_entropy(logits16, y, rows, classes, r.dlogits_bf16(), scale, stats.data());
    r.backward(x, nullptr, kBatch);
  } else {
    DeviceArray<float> dlogits(dev, std::size_t(rows) * classes);
    dev.softmax_cross_entropy(r.forward(x, kBatch), y, rows, classes, dlogits.data(), scale,
                              stats.data());
    r.backward(x, dlogits.data(), kBatch);
  }
  return {stats.download()[0], r.gradients()};
}

Pass chunked(Device& dev, Replica& r, const float* x, const std::int32_t* y, float scale) {
  DeviceArray<LossStats> stats(dev, 1);
  r.zero_grads();
  r.forward_hidden(x, kBatch);
  r.head_loss(kBatch, {.labels = y, .grad_scale = scale, .stats = stats.data()}, true);
  r.backward(x, nullptr, kBatch);
  return {stats.download()[0], r.gradients()};
}

// |a - b| within rel x the largest |b|: sums of the same products in another order.
void check_close(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  REQUIRE(a.size() == b.size());
  double largest = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    largest = std::max(largest, double(std::fabs(b[i])));
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  }
  CAPTURE(worst);
  CAPTURE(largest);
  CHECK(largest > 0.0);
  CHECK(worst <= rel * largest);
}

// A model of spec_of(llama), its device and masked labels for a batch of kBatch.
struct Case {
  explicit Case(bool llama)
      : spec(spec_of(llama)),
        model(Model::gpt(spec)),
        dev(lockstep::make_cpu_device(0, 1)),
        rows(kBatch * spec.context),
        classes(model.outputs() / spec.context),
        scale(1.0f / float(rows)),
        labels(masked_labels(rows, spec.vocab_size)),
        y(on_device(*dev, labels)) {}
  GptSpec spec;
  Model model;
  std::unique_ptr<Device> dev;
  int rows, classes;
  float scale;
  std::vector<std::int32_t> labels;
  DeviceArray<std::int32_t> y;
};

}  // namespace

TEST_CASE("chunked classifier: the loss and every gradient (the head's dW and din) equal the "
          "unchunked head's, tied and untied, fp32 and bf16, masked labels, 300 rows") {
  for (const bool llama : {false, true})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      CAPTURE(llama);
      CAPTURE(lockstep::to_string(precision));
      Case c(llama);
      auto x = on_device(*c.dev, random_tokens(std::size_t(c.rows), c.spec.vocab_size, 5));
      Replica r(*c.dev, c.model, kBatch, precision);
      REQUIRE(r.fuses_loss());
      r.load_parameters(c.model.initial_parameters(7));
      const Pass want = unchunked(*c.dev, r, x.data(), c.y.data(), c.rows, c.classes, c.scale);
      const Pass got = chunked(*c.dev, r, x.data(), c.y.data(), c.scale);
      CHECK(got.loss.label_error == 0);
      CHECK(got.loss.correct == want.loss.correct);
      CHECK(got.loss.loss_sum == doctest::Approx(want.loss.loss_sum).epsilon(1e-6));
      // Each row's loss is computed as before; the masked rows add nothing.
      const double counted = double(
          c.rows - std::count(c.labels.begin(), c.labels.end(), lockstep::kIgnoreLabel));
      CHECK(got.loss.loss_sum / counted == doctest::Approx(std::log(70.0)).epsilon(0.05));
      check_close(got.grads, want.grads, precision == Precision::bf16 ? 1e-4 : 1e-5);
      // The head's own weight (untied: the first V x C parameters) gets its gradient.
      if (llama) {
        std::vector<float> head(got.grads.begin(), got.grads.begin() + 70 * 16);
        CHECK(*std::max_element(head.begin(), head.end()) > 0.0f);
      }
      // Without gradients (evaluation): the same loss, and the gradients left alone.
      DeviceArray<LossStats> eval(*c.dev, 1);
      r.forward_hidden(x.data(), kBatch);
      r.head_loss(kBatch, {.labels = c.y.data(), .grad_scale = 0.0f, .stats = eval.data()},
                  false);
      CHECK(eval.download()[0].loss_sum == got.loss.loss_sum);
      CHECK(r.gradients() == got.grads);
    }
}

// The head alone: forward_loss's din, dW and loss against the head's forward, the classifier
// over all its logits and its backward (bf16: the fused classifier in place, as before).
TEST_CASE("chunked classifier: the head's din, dW and loss equal its forward, loss and backward's, "
          "tied and untied, fp32 and bf16, masked labels, 300 rows") {
  constexpr int kVocab = 70, kT = 100, kC = 16, kRows = kBatch * kT;
  for (const bool tied : {true, false})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      CAPTURE(tied);
      CAPTURE(lockstep::to_string(precision));
      const auto head = tied ? lockstep::make_tied_lm_head(0, kVocab, kT, kC)
                             : lockstep::make_lm_head(kVocab, kT, kC);
      REQUIRE(head->fuses_loss());
      const int classes = head->out_features() / kT;  // 128: 58 columns of -inf padding
      auto dev = lockstep::make_cpu_device(0, 1);
      const std::vector<float> w = random_floats(std::size_t(kVocab) * kC, 31);
      auto wd = on_device(*dev, w);
      auto w16 = on_device(*dev, to_bits(w));
      auto x = on_device(*dev, random_floats(std::size_t(kRows) * kC, 32, -2.0, 2.0));
      auto y = on_device(*dev, masked_labels(kRows, kVocab));
      DeviceArray<float> saved(*dev, head->workspace_size(kBatch, precision)),
          scratch(*dev, head->scratch_size(kBatch, precision));
      const bool bf16 = precision == Precision::bf16;
      lockstep::LayerWorkspace ws{.saved = saved.data(), .scratch = scratch.data(),
                                  .precision = precision,
                                  .params_bf16 = bf16 ? w16.data() : nullptr};
      const float scale = 1.0f / kRows;
      // Unchunked.
      DeviceArray<float> logits(*dev, std::size_t(kRows) * classes), dlogits(*dev, logits.size());
      DeviceArray<std::uint16_t> logits16(*dev, bf16 ? logits.size() : 0);
      auto dw_want = on_device(*dev, std::vector<float>(w.size(), 0.0f));
      DeviceArray<float> din_want(*dev, std::size_t(kRows) * kC);
      DeviceArray<LossStats> want(*dev, 1);
      lockstep::LayerWorkspace whole = ws;
      whole.out_bf16 = logits16.data();
      whole.dout_bf16 = logits16.data();
      head->forward(*dev, wd.data(), x.data(), logits.data(), kBatch, whole);
      if (bf16)
        dev->softmax_cross_entropy(logits16.data(), y.data(), kRows, classes, logits16.data(),
                                   scale, want.data());
      else
        dev->softmax_cross_entropy(logits.data(), y.data(), kRows, classes, dlogits.data(), scale,
                                   want.data());
      head->backward(*dev, wd.data(), dw_want.data(), x.data(), logits.data(), dlogits.data(),
                     din_want.data(), kBatch, whole);
      // Chunked.
      auto dw_got = on_device(*dev, std::vector<float>(w.size(), 0.0f));
      DeviceArray<float> din_got(*dev, din_want.size());
      DeviceArray<LossStats> got(*dev, 1);
      head->forward_loss(*dev, wd.data(), dw_got.data(), x.data(), din_got.data(),
                         {.labels = y.data(), .grad_scale = scale, .stats = got.data()}, kBatch,
                         ws);
      const LossStats g = got.download()[0], h = want.download()[0];
      CHECK(g.correct == h.correct);
      CHECK(g.loss_sum == doctest::Approx(h.loss_sum).epsilon(1e-6));
      check_close(din_got.download(), din_want.download(), 1e-6);
      check_close(dw_got.download(), dw_want.download(), bf16 ? 1e-5 : 1e-6);
    }
}

// Three SGD steps each way from the same parameters: the chunked head trains the model the
// unchunked one does, to fp32 rounding.
TEST_CASE("chunked classifier: three training steps end where the unchunked head's end, tied "
          "and untied, fp32 and bf16, masked labels") {
  for (const bool llama : {false, true})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      CAPTURE(llama);
      CAPTURE(lockstep::to_string(precision));
      Case c(llama);
      std::vector<float> params[2] = {c.model.initial_parameters(3),
                                      c.model.initial_parameters(3)};
      Replica r(*c.dev, c.model, kBatch, precision);
      std::vector<double> losses[2];
      for (int step = 0; step < 3; ++step) {
        auto x =
            on_device(*c.dev, random_tokens(std::size_t(c.rows), c.spec.vocab_size, 20 + step));
        for (int way = 0; way < 2; ++way) {
          r.load_parameters(params[way]);
          const Pass p =
              way == 0 ? unchunked(*c.dev, r, x.data(), c.y.data(), c.rows, c.classes, c.scale)
                       : chunked(*c.dev, r, x.data(), c.y.data(), c.scale);
          for (std::size_t i = 0; i < params[way].size(); ++i) params[way][i] -= 0.5f * p.grads[i];
          losses[way].push_back(p.loss.loss_sum);
        }
      }
      for (int step = 0; step < 3; ++step)
        CHECK(losses[1][step] == doctest::Approx(losses[0][step]).epsilon(1e-5));
      CHECK(losses[1][2] < losses[1][0]);  // it trains
      check_close(params[1], params[0], precision == Precision::bf16 ? 1e-4 : 1e-5);
    }
}

// A bad label is named by its row in the batch, not within its chunk, and of several the lowest
// (as the unchunked classifier names them): 512 rows are two chunks of 256.
TEST_CASE("chunked classifier: a bad label is named by its row in the batch, the lowest of "
          "several, fp32 and bf16") {
  constexpr int kVocab = 70, kT = 128, kC = 16, kSequences = 4, kRows = kSequences * kT;
  const auto head = lockstep::make_tied_lm_head(0, kVocab, kT, kC);
  auto dev = lockstep::make_cpu_device(0, 1);
  const std::vector<float> w = random_floats(std::size_t(kVocab) * kC, 31);
  auto wd = on_device(*dev, w);
  auto w16 = on_device(*dev, to_bits(w));
  auto x = on_device(*dev, random_floats(std::size_t(kRows) * kC, 32, -2.0, 2.0));
  struct Bad {
    std::vector<int> rows;
    int named;
  };
  // Row 300 is row 44 of the second chunk; rows 40 and 260 are rows 40 and 4 of theirs.
  for (const Bad& bad : {Bad{{300}, 300}, Bad{{40, 260}, 40}})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      CAPTURE(bad.named);
      CAPTURE(lockstep::to_string(precision));
      std::vector<std::int32_t> labels = random_labels(kRows, kVocab, 33);
      for (int r : bad.rows) labels[std::size_t(r)] = 1000 + r;
      auto y = on_device(*dev, labels);
      DeviceArray<float> saved(*dev, head->workspace_size(kSequences, precision)),
          scratch(*dev, head->scratch_size(kSequences, precision));
      const lockstep::LayerWorkspace ws{
          .saved = saved.data(), .scratch = scratch.data(), .precision = precision,
          .params_bf16 = precision == Precision::bf16 ? w16.data() : nullptr};
      auto dw = on_device(*dev, std::vector<float>(w.size(), 0.0f));
      DeviceArray<float> din(*dev, std::size_t(kRows) * kC);
      DeviceArray<LossStats> stats(*dev, 1);
      head->forward_loss(*dev, wd.data(), dw.data(), x.data(), din.data(),
                         {.labels = y.data(), .grad_scale = 1.0f, .stats = stats.data()},
                         kSequences, ws);
      const std::uint64_t key = stats.download()[0].label_error;
      REQUIRE(key != 0);
      CHECK(lockstep::detail::label_error_row(key) == bad.named);
      CHECK(lockstep::detail::label_error_label(key) == 1000 + bad.named);
    }
}
