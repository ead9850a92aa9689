// Supervised fine-tuning's loss and packing, on the CPU:
//   - masked labels (kIgnoreLabel) add no loss and no gradient: finite differences of a whole
//     model's masked mean agree with backward, and a masked row's logits move nothing;
//   - N workers x batch B equal 1 worker x batch N*B when the workers' counted labels differ
//     (Note [Global token mean] in src/train/worker_loop.cpp);
//   - a packed window gives the loss and gradients of its conversations each in a window of its
//     own, on both attention paths, for a Llama-family decoder (rotary positions) and GPT-2
//     (learned positions, read at each row's position) (Note [Packed attention] in
//     src/model/attention.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../model/gradcheck.hpp"
#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;

namespace {

constexpr GptSpec kLlama{.vocab_size = 13, .context = 12, .n_layer = 2, .n_head = 2,
                         .d_model = 8, .norm = NormKind::rmsnorm, .norm_eps = 1e-6,
                         .positions = PositionKind::rope, .mlp = MlpKind::swiglu,
                         .intermediate_size = 12, .n_kv_head = 1, .qkv_bias = false,
                         .proj_bias = false, .tie_embeddings = false};
// GPT-2's parts (layernorm, learned positions, gelu) at the same size.
constexpr GptSpec kGpt2{.vocab_size = 13, .context = 12, .n_layer = 2, .n_head = 2,
                        .d_model = 8};

// Conversation i: 3 + i % 7 ids over 13 tokens; even ones count all but their first id, odd
// ones their last only, so two workers interleaving them count very different numbers.
std::vector<ChatTokens> conversations(int n) {
  std::vector<ChatTokens> out;
  for (int i = 0; i < n; ++i) {
    ChatTokens c;
    const int len = 3 + i % 7;
    for (int k = 0; k < len; ++k) {
      c.ids.push_back(static_cast<std::uint32_t>((i * 5 + k * 3) % 13));
      c.counted.push_back(i % 2 == 0 ? k > 0 : k == len - 1);
    }
    out.push_back(std::move(c));
  }
  return out;
}

// Loss sum, counted labels and parameter gradients of `data`'s windows through `replica`, the
// gradient that of the mean over the counted labels.
struct Pass {
  double loss_sum = 0.0;
  std::int64_t counted = 0;
  std::vector<float> grads;
};
Pass run_windows(Replica& replica, const Dataset& data, bool positions) {
  Device& dev = replica.device();
  const int t = data.features(), rows = static_cast<int>(data.size());
  std::vector<float> x(std::size_t(rows) * t);
  std::vector<std::int32_t> y(x.size()), pos(x.size());
  for (int i = 0; i < rows; ++i) {
    data.get(std::size_t(i), x.data() + std::size_t(i) * t, y.data() + std::size_t(i) * t);
    data.get_positions(std::size_t(i), pos.data() + std::size_t(i) * t);
  }
  Pass p;
  for (std::int32_t label : y) p.counted += label != kIgnoreLabel;
  auto xd = test::on_device(dev, x);
  auto yd = test::on_device(dev, y);
  auto pd = test::on_device(dev, pos);
  replica.set_positions(positions ? pd.data() : nullptr);
  const int padded = replica.model().outputs() / t;
  DeviceArray<float> dlogits(dev, x.size() * padded);
  replica.zero_grads();
  p.loss_sum = dev.softmax_cross_entropy(replica.forward(xd.data(), rows), yd.data(), rows * t,
                                         padded, dlogits.data(),
                                         1.0f / static_cast<float>(p.counted))
                   .loss_sum;
  replica.backward(xd.data(), dlogits.data(), rows);
  replica.set_positions(nullptr);
  p.grads = replica.gradients();
  return p;
}

}  // namespace

TEST_CASE("chat loss: masked labels add no loss and no gradient (finite differences)") {
  GptSpec spec = kLlama;
  spec.context = 5;
  const Model model = Model::gpt(spec);
  auto dev = make_cpu_device(0, 2);
  const int batch = 2, t = spec.context, rows = batch * t;
  Replica replica(*dev, model, batch);
  std::vector<float> params = model.initial_parameters(3);
  for (float& p : params) p *= 2.0f;
  auto xd = test::on_device(*dev, test::random_tokens(std::size_t(rows), spec.vocab_size, 16));
  std::vector<std::int32_t> labels = test::random_labels(std::size_t(rows), spec.vocab_size, 17);
  for (int r : {0, 1, 4, 5, 6}) labels[std::size_t(r)] = kIgnoreLabel;  // 5 of 10 count
  auto yd = test::on_device(*dev, labels);
  const int padded = model.outputs() / t;
  DeviceArray<float> dlogits(*dev, std::size_t(rows) * padded);
  const auto loss = [&](float* grad) {
    replica.load_parameters(params);
    return dev->softmax_cross_entropy(replica.forward(xd.data(), batch), yd.data(), rows, padded,
                                      grad, 1.0f / 5)
               .loss_sum /
           5;
  };
  replica.zero_grads();
  loss(dlogits.data());
  // A masked row's logit gradient is zero, exactly.
  const std::vector<float> d = dlogits.download();
  for (int r : {0, 1, 4, 5, 6})
    for (int j = 0; j < padded; ++j) REQUIRE(d[std::size_t(r) * padded + j] == 0.0f);
  replica.backward(xd.data(), dlogits.data(), batch);
  const std::vector<float> analytic = replica.gradients();
  std::vector<double> fd;
  for (std::size_t i = 0; i < params.size(); ++i)
    fd.push_back(test::central_difference(params, i, [&] { return loss(nullptr); }, 1e-3f));
  const std::string miss = test::mismatch(fd, analytic);
  CHECK_MESSAGE(miss.empty(), miss);

  // The loss of the counted rows alone, whatever the masked rows' logits hold.
  std::vector<float> logits(std::size_t(rows) * 16), grad(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 7) * 0.3f;
  std::vector<std::int32_t> some = {3, kIgnoreLabel, 5};
  auto ld = test::on_device(*dev, std::vector<float>(logits.begin(), logits.begin() + 48));
  auto sd = test::on_device(*dev, some);
  const double before = dev->softmax_cross_entropy(ld.data(), sd.data(), 3, 16, nullptr, 1.0f)
                            .loss_sum;
  std::vector<float> moved(logits.begin(), logits.begin() + 48);
  for (int j = 16; j < 32; ++j) moved[std::size_t(j)] += 10.0f * float(j);
  ld.upload(moved);
  const LossStats after = dev->softmax_cross_entropy(ld.data(), sd.data(), 3, 16, nullptr, 1.0f);
  CHECK(after.loss_sum == before);
}

TEST_CASE("chat: N workers x batch B equal 1 worker x batch N*B with unequal counted labels") {
  // 60 conversations in 8-position windows, one each: worker 0 takes the even ones (about 5
  // counted labels each), worker 1 the odd ones (1 each).
  auto all = conversations(60);
  auto train = std::make_shared<ChatDataset>(all, 8, 13, false);
  REQUIRE(train->size() == 60);
  for (int accumulate : {1, 2}) {  // global batches of 6 and of 12 (two micro-batches)
    CAPTURE(accumulate);
    Config many = test::small_llama_config(2, 3), one = test::small_llama_config(1, 6);
    for (Config* c : {&many, &one}) {
      c->data.shuffle = false;
      c->trainer.accumulate_steps = accumulate;
    }
    Trainer m(many, train, nullptr), o(one, train, nullptr);
    const Summary sm = m.run(), so = o.run();
    CHECK(sm.replicas_identical);
    CHECK(sm.loss_tokens == so.loss_tokens);
    CHECK(sm.final_train_loss == doctest::Approx(so.final_train_loss).epsilon(1e-5));
    // A per-worker mean would weigh worker 1's single labels 5 times more: 1e-1 apart.
    CHECK(test::relative_difference(m.final_parameters(), o.final_parameters()) <= 1e-4);
  }
}

TEST_CASE("chat: a packed window gives the loss and gradients of its conversations one a window") {
  // 5 + 4 + 4 ids: 4 + 3 + 3 positions, packed into one window of 12, padded into three.
  std::vector<ChatTokens> convs = conversations(4);
  convs.erase(convs.begin());  // lengths 4, 5, 6: 3 + 4 + 5 positions
  const ChatDataset packed(convs, kLlama.context, kLlama.vocab_size, true);
  const ChatDataset padded(convs, kLlama.context, kLlama.vocab_size, false);
  REQUIRE(packed.size() == 1);
  REQUIRE(padded.size() == 3);
  for (const auto& [name, spec] : {std::pair{"llama", kLlama}, std::pair{"gpt2", kGpt2}})
  for (const AttentionKind path : {AttentionKind::materialized, AttentionKind::fused}) {
    CAPTURE(name);
    CAPTURE(to_string(path));
    const Model model = Model::gpt(spec, path);
    auto dev = make_cpu_device(0, 2);
    Replica replica(*dev, model, 3);
    std::vector<float> params = model.initial_parameters(7);
    for (float& p : params) p *= 3.0f;  // attention far from uniform
    replica.load_parameters(params);
    const Pass one = run_windows(replica, padded, false);
    const Pass many = run_windows(replica, packed, true);
    CHECK(many.counted == one.counted);
    CHECK(many.loss_sum == doctest::Approx(one.loss_sum).epsilon(1e-5));
    CHECK(test::relative_difference(many.grads, one.grads) <= 1e-5);
    // Without the positions the conversations see each other: the test can fail.
    const Pass leaky = run_windows(replica, packed, false);
    CHECK(std::abs(leaky.loss_sum - one.loss_sum) > 1e-3 * std::abs(one.loss_sum));
  }
}

TEST_CASE("chat: packing on cuda: auto chooses the attention as for unpacked data") {
  Config cfg = test::small_llama_config(1, 2);
  cfg.data.dataset = DatasetKind::chat;
  cfg.data.path = "chat.jsonl";
  cfg.data.tokenizer = "tokenizer";
  cfg.data.pack = true;
  cfg.validate();
  cfg.trainer.precision = Precision::bf16;
  cfg.model.head_dim = 8;
  cfg.model.attention = AttentionKind::automatic;
  Config unpacked = cfg;
  unpacked.data.pack = false;
  // cuDNN's fused attention takes packed windows' mask as a score bias (Note [cuDNN packed
  // mask], checked on an H200): auto picks the same path, for the same reason, packed or not.
  const AttentionChoice packed = attention_choice(cfg, "cuda");
  CHECK(packed.path == attention_choice(unpacked, "cuda").path);
  CHECK(packed.detail == attention_choice(unpacked, "cuda").detail);
  cfg.model.attention = AttentionKind::fused;
  CHECK(attention_choice(cfg, "cpu").path == AttentionKind::fused);  // the tiled path takes it

  // GPT-2's learned positions restart at each conversation too: accepted by the config and by
  // the trainer, whose run packs (the loss and gradients: the case above).
  const std::string yaml =
      "model: {type: gpt, context: 8, n_layer: 1, n_head: 2, d_model: 8}\n"
      "data: {dataset: chat, path: c.jsonl, tokenizer: t, pack: true}\n"
      "trainer: {steps: 1}\n";
  CHECK(parse_config(yaml, "s.yaml").data.pack);
  Config gpt2 = test::small_gpt_config(1, 2);
  gpt2.trainer.steps = 2;
  Trainer packed_gpt2(gpt2, std::make_shared<ChatDataset>(conversations(8), 8, 13, true), nullptr);
  CHECK(std::isfinite(packed_gpt2.run().final_train_loss));
  CHECK_THROWS_WITH_AS(
      parse_config("data: {dataset: synthetic, skip_bad_records: true}\n", "k.yaml"),
      doctest::Contains("data.skip_bad_records: a key of chat data, got data.dataset synthetic"),
      ConfigError);
}
