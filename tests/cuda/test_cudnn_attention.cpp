// cuDNN's fused attention (Note [cuDNN attention] in src/cuda/cudnn_attention.hpp). Without a
// GPU: the layouts that read q, k, v and write y in place, the graph cache's key, the refusals
// (T = 1 among them) and model.attention's choice on cuda. On a GPU: forward (y and the
// log-sum-exp) and every gradient against the CPU's tiled attention in bf16 (itself tested
// against the materialised path in tests/cpu/test_attention.cpp), T = 1 refused by the device
// before cuDNN is asked, and a GPT's bf16 step with the fused path against the materialised one,
// each gradient tensor on its own. Grouped-query attention (AttentionShape::kv_heads) in the
// layouts, the keys, cuDNN against the CPU, and the materialised path (model/attention.cpp, on
// CUDA's gemm_batched and causal softmax) against the CPU's in fp32 and bf16. Built with the
// CUDA backend only; the cuDNN cases with cuDNN only (a skip that says so otherwise), in the
// suite "cuda cudnn", run last.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/bf16.hpp"
#include "cuda/cudnn_attention.hpp"
#include "gpu_vs_cpu.hpp"
#include "model/attention.hpp"

using namespace lockstep;
using namespace lockstep::test;
using lockstep::cuda::attention_key;
using lockstep::cuda::attention_layout;
using lockstep::cuda::cudnn_attention_refusal;
using lockstep::cuda::TensorLayout;

namespace {

// dq, dk and dv out of a gradient in qkv's layout (B T, (H + 2 Hkv) D), each row by row.
Outputs qkv_parts(const std::vector<float>& dqkv, const AttentionShape& s) {
  const std::size_t width = std::size_t(qkv_width(s)), d = std::size_t(s.head_size);
  const std::size_t q = s.heads * d, kv = std::size_t(kv_heads_of(s)) * d;
  Outputs out(3);
  for (std::size_t r = 0; r < dqkv.size() / width; ++r) {
    const auto row = dqkv.begin() + r * width;
    out[0].insert(out[0].end(), row, row + q);
    out[1].insert(out[1].end(), row + q, row + q + kv);
    out[2].insert(out[2].end(), row + q + kv, row + q + 2 * kv);
  }
  return out;
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuDNN attention layout: q, k, v read in place from qkv, o written into y") {
    // B 2, T 5, H 3, D 8: C 24, qkv rows 72 wide.
    const auto at = attention_layout({2, 5, 3, 8});
    CHECK(at.q == TensorLayout{{2, 3, 5, 8}, {5 * 72, 8, 72, 1}, 0});
    CHECK(at.k == TensorLayout{{2, 3, 5, 8}, {5 * 72, 8, 72, 1}, 24});
    CHECK(at.v == TensorLayout{{2, 3, 5, 8}, {5 * 72, 8, 72, 1}, 48});
    CHECK(at.o == TensorLayout{{2, 3, 5, 8}, {5 * 24, 8, 24, 1}, 0});
    CHECK(at.stats == TensorLayout{{2, 3, 5, 1}, {15, 5, 1, 1}, 0});
    // Element (b, h, t, d) of k is qkv[(b T + t) 3C + C + h D + d], as model/attention.cpp
    // places it: checked at the last element of each head.
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 3; ++h) {
        const std::int64_t t = 4, d = 7;
        const std::int64_t at_k = at.k.offset + b * at.k.stride[0] + h * at.k.stride[1] +
                                  t * at.k.stride[2] + d * at.k.stride[3];
        CHECK(at_k == (b * 5 + t) * 72 + 24 + h * 8 + d);
        const std::int64_t at_o =
            b * at.o.stride[0] + h * at.o.stride[1] + t * at.o.stride[2] + d * at.o.stride[3];
        CHECK(at_o == (b * 5 + t) * 24 + h * 8 + d);
      }
    // Grouped-query attention, H 6 on Hkv 2: qkv rows (6 + 2 x 2) 8 = 80 wide, k and v of 2
    // heads at columns 48 and 64; y as before.
    const auto gqa = attention_layout({2, 5, 6, 8, 2});
    CHECK(gqa.q == TensorLayout{{2, 6, 5, 8}, {5 * 80, 8, 80, 1}, 0});
    CHECK(gqa.k == TensorLayout{{2, 2, 5, 8}, {5 * 80, 8, 80, 1}, 48});
    CHECK(gqa.v == TensorLayout{{2, 2, 5, 8}, {5 * 80, 8, 80, 1}, 64});
    CHECK(gqa.o == TensorLayout{{2, 6, 5, 8}, {5 * 48, 8, 48, 1}, 0});
    CHECK(gqa.stats == TensorLayout{{2, 6, 5, 1}, {30, 5, 1, 1}, 0});
    // kv_heads = heads is the layout without grouping.
    CHECK(attention_layout({2, 5, 3, 8, 3}).k == at.k);
    CHECK(attention_layout({2, 5, 3, 8, 3}).v == at.v);
    // Packed sequences' bias (Note [cuDNN packed mask]): (B, 1, T, T), one contiguous (T, T)
    // per sequence that every head reads; element (b, 0, i, j) at (b T + i) T + j, as the
    // kernel writes it.
    CHECK(at.bias == TensorLayout{{2, 1, 5, 5}, {25, 25, 5, 1}, 0});
  }

  TEST_CASE("cuDNN attention, packed: the bias's bytes and its own graphs") {
    const std::int32_t positions[1] = {0};  // only its being set matters here
    const AttentionShape plain{8, 1024, 12, 64};
    AttentionShape packed = plain;
    packed.positions = positions;
    CHECK(lockstep::cuda::packed_bias_bytes(plain) == 0);
    CHECK(lockstep::cuda::packed_bias_bytes(packed) == 2u * 8 * 1024 * 1024);
    AttentionShape odd{3, 5, 2, 8};
    odd.positions = positions;
    CHECK(lockstep::cuda::packed_bias_bytes(odd) == 256);  // 150 bytes, rounded up to 256
    for (bool backward : {false, true}) {
      CHECK(attention_key(packed, backward).packed);
      CHECK_FALSE(attention_key(plain, backward).packed);
      CHECK(attention_key(packed, backward) != attention_key(plain, backward));
    }
  }

  TEST_CASE("cuDNN attention graphs: one per shape and direction") {
    const AttentionShape s{8, 1024, 12, 64};
    CHECK(attention_key(s, false) == attention_key(s, false));
    CHECK(attention_key(s, false) != attention_key(s, true));
    // The backward's algorithm is part of its key; the forward has none.
    CHECK(attention_key(s, true, false) != attention_key(s, true));
    CHECK(attention_key(s, false, false) == attention_key(s, false));
    for (const AttentionShape other :
         {AttentionShape{4, 1024, 12, 64}, AttentionShape{8, 512, 12, 64},
          AttentionShape{8, 1024, 6, 64}, AttentionShape{8, 1024, 12, 128},
          AttentionShape{8, 1024, 12, 64, 4}, AttentionShape{8, 1024, 12, 64, 1}})
      CHECK(attention_key(other, false) != attention_key(s, false));
    // kv_heads 0 means heads: one graph for both spellings.
    CHECK(attention_key({8, 1024, 12, 64, 12}, true) == attention_key(s, true));
  }

  // The materialised path on CUDA (model/attention.cpp over gemm_batched, with beta 1 to sum a
  // kv head's dK and dV over its query heads) against the CPU's, for grouped-query attention:
  // batch 1 and 3 so that its products batch both ways. fp32: the sums' order only; bf16: both
  // round at the same points, so a rounding may land on a neighbour (two bf16 ulps).
  TEST_CASE("cuda: materialised grouped-query attention against the CPU's, fp32 and bf16") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (const bool bf16 : {false, true})
      for (const AttentionShape s :
           {AttentionShape{1, 65, 6, 16, 2}, AttentionShape{3, 65, 6, 16, 2},
            AttentionShape{3, 130, 4, 64, 1}, AttentionShape{2, 64, 4, 32, 4}}) {
        CAPTURE(fmt::format("{} B={} T={} H={} Hkv={} D={}", bf16 ? "bf16" : "fp32", s.batch,
                            s.T, s.heads, s.kv_heads, s.head_size));
        const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
        const std::size_t width = std::size_t(qkv_width(s));
        const std::size_t squares = std::size_t(s.batch) * s.heads * s.T * s.T;
        const std::vector<float> qkv = random_floats(n * width, 700 + s.T, -2.0, 2.0);
        const std::vector<float> dy = random_floats(n * c, 800 + s.T);
        const auto op = [&](Device& dev) -> Outputs {
          auto qkv32 = on_device(dev, qkv), dy32 = on_device(dev, dy);
          auto qkv16 = on_device(dev, to_bits(qkv)), dy16 = on_device(dev, to_bits(dy));
          const MatIn q_in = bf16 ? MatIn{nullptr, qkv16.data()} : MatIn{qkv32.data()};
          const MatIn dy_in = bf16 ? MatIn{nullptr, dy16.data()} : MatIn{dy32.data()};
          auto y32 = poisoned(dev, bf16 ? 0 : n * c), p32 = poisoned(dev, bf16 ? 0 : squares);
          auto y16 = poisoned_bf16(dev, bf16 ? n * c : 0);
          auto p16 = poisoned_bf16(dev, bf16 ? squares : 0);
          auto sq = poisoned(dev, squares), product = poisoned(dev, bf16 ? n * c : 0);
          auto sq16 = poisoned_bf16(dev, bf16 ? squares : 0);
          auto dqkv = poisoned(dev, n * width);
          const detail::AttentionBuffers buf{.path = AttentionKind::materialized,
                                             .probs = {p32.data(), p16.data()},
                                             .squares = sq.data(),
                                             .squares16 = sq16.data(),
                                             .y_product = product.data()};
          const MatOut y{y32.data(), y16.data()};
          detail::attention_forward(dev, s, q_in, y, buf);
          detail::attention_backward(dev, s, q_in, y.input(), dy_in, buf, dqkv.data());
          Outputs out{bf16 ? widened(y16.download()) : y32.download()};
          for (std::vector<float>& part : qkv_parts(dqkv.download(), s)) out.push_back(part);
          return out;
        };
        Tolerance tol = fp32_sums(s.T + s.head_size + 4, c);
        if (bf16) tol = {tol.rel + 2 * kBf16Ulp, tol.abs + 2 * kBf16Ulp, c};
        const Tolerance kv_tol{tol.rel, tol.abs, std::size_t(kv_heads_of(s)) * s.head_size};
        compare_each(*gpu, op, {tol, tol, kv_tol, kv_tol});
      }
  }

  TEST_CASE("cuDNN attention refuses fp32 and tf32, head sizes not a multiple of 8, old cuDNN, "
            "T = 1") {
    CHECK(cudnn_attention_refusal(Precision::bf16, 64, 1024, 91900).empty());
    CHECK(cudnn_attention_refusal(Precision::bf16, 0, 0, 90000).empty());  // shape unknown
    CHECK(cudnn_attention_refusal(Precision::bf16, 256, 2, 91900).empty());
    CHECK(cudnn_attention_refusal(Precision::bf16, 8, 7, 91900).empty());
    CHECK(cudnn_attention_refusal(Precision::bf16, 24, 64, 91900).empty());
    for (const Precision p : {Precision::fp32, Precision::tf32})
      CHECK(cudnn_attention_refusal(p, 64, 64, 91900).find("half-precision") !=
            std::string::npos);
    CHECK(cudnn_attention_refusal(Precision::bf16, 12, 64, 91900) ==
          "cuDNN's fused attention needs a head size that is a multiple of 8, and it is 12");
    CHECK(cudnn_attention_refusal(Precision::bf16, 264, 64, 91900).find("up to 256") !=
          std::string::npos);
    CHECK(cudnn_attention_refusal(Precision::bf16, 64, 64, 8907).find("8.9.7, older than 9.0") !=
          std::string::npos);
    // The frontend's backward: "s_q = s_kv = 1 is not supported" (issue 40).
    CHECK(cudnn_attention_refusal(Precision::bf16, 64, 1, 91900).find("s_q = s_kv = 1") !=
          std::string::npos);
    CHECK(lockstep::cuda::cudnn_version_text(91900) == "9.19.0");
    CHECK(lockstep::cuda::cudnn_version_text(8907) == "8.9.7");
  }
}

// Note [cuDNN plan cache]: the cases that build cuDNN graphs on a GPU are a suite of their own,
// run after the other CUDA cases (scripts/gpu_check.sh: -ts='cuda*' -tse='cuda cudnn', then
// -ts='cuda cudnn'), so that seconds of plan builds cannot starve them of the phase's time.
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
namespace {

// Forward (y and the log-sum-exp) and backward (dq, dk, dv) of `s` on fresh random bf16 inputs,
// the GPU's cuDNN path against the CPU's tiled one; `positions` (B T), when not empty, packs
// the windows (Note [cuDNN packed mask]); attention_tolerance's bounds.
void compare_with_cpu(Device& gpu, const AttentionShape& s,
                      const std::vector<std::int32_t>& positions, std::uint64_t seed) {
  const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
  const std::size_t width = std::size_t(qkv_width(s));
  const std::size_t rows = std::size_t(s.batch) * s.heads * s.T;
  const std::vector<float> qkv = random_floats(n * width, seed, -2.0, 2.0);
  const std::vector<float> dy = random_floats(n * c, seed + 100);
  // y, lse, dq, dk, dv: y and the gradients of one position side by side (rows of C).
  const auto op = [&](Device& dev) -> Outputs {
    // (one unread element when not packed: no array of none)
    auto pos = on_device(dev, positions.empty() ? std::vector<std::int32_t>{0} : positions);
    AttentionShape shape = s;
    if (!positions.empty()) shape.positions = pos.data();
    auto qkv16 = on_device(dev, to_bits(qkv));
    auto dy16 = on_device(dev, to_bits(dy));
    auto y16 = poisoned_bf16(dev, n * c);
    auto lse = poisoned(dev, rows);
    auto dqkv = poisoned(dev, n * width);
    dev.attention_forward(shape, {nullptr, qkv16.data()}, {nullptr, y16.data()}, lse.data());
    dev.attention_backward(shape, {nullptr, qkv16.data()}, {nullptr, y16.data()},
                           {nullptr, dy16.data()}, lse.data(), dqkv.data());
    Outputs out{widened(y16.download()), lse.download()};
    for (std::vector<float>& part : qkv_parts(dqkv.download(), s)) out.push_back(part);
    return out;
  };
  const AttentionTolerance tol = attention_tolerance(s);
  compare_each(gpu, op, {tol.y, tol.lse, tol.dq, tol.kv, tol.kv});
}

}  // namespace
#endif

TEST_SUITE("cuda cudnn") {
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  TEST_CASE("model.attention on cuda: auto runs cuDNN's under bf16, the materialised path "
            "otherwise, saying why") {
    // A context of 1 is refused by the rule itself, before any graph is built (issue 40: the
    // frontend's backward refuses s_q = s_kv = 1): auto runs it materialised, fused throws.
    const AttentionChoice one = choose_attention(AttentionKind::automatic, "cuda",
                                                 Precision::bf16, 1, 64);
    CHECK(one.path == AttentionKind::materialized);
    CHECK(one.detail.find("s_q = s_kv = 1") != std::string::npos);
    CHECK_THROWS_WITH_AS(choose_attention(AttentionKind::fused, "cuda", Precision::bf16, 1, 64),
                         doctest::Contains("s_q = s_kv = 1"), InputError);
    const auto choose = [](AttentionKind kind, Precision p, int head_size) {
      return choose_attention(kind, "cuda", p, 64, head_size);
    };
    // With a GPU the shape's graphs are built to ask cuDNN (an H200 takes head size 64).
    CHECK(choose(AttentionKind::automatic, Precision::bf16, 64).path == AttentionKind::fused);
    CHECK(choose(AttentionKind::fused, Precision::bf16, 64).path == AttentionKind::fused);
    const AttentionChoice fp32 = choose(AttentionKind::automatic, Precision::fp32, 64);
    CHECK(fp32.path == AttentionKind::materialized);
    CHECK(fp32.detail.find("half-precision") != std::string::npos);
    // A head size cuDNN refuses falls back, and says so.
    const AttentionChoice odd = choose(AttentionKind::automatic, Precision::bf16, 12);
    CHECK(odd.path == AttentionKind::materialized);
    CHECK(odd.detail.find("multiple of 8") != std::string::npos);
    CHECK_THROWS_WITH_AS(choose(AttentionKind::fused, Precision::tf32, 64),
                         doctest::Contains("model.attention: fused"), InputError);
    CHECK_THROWS_WITH_AS(choose(AttentionKind::fused, Precision::bf16, 12),
                         doctest::Contains("multiple of 8"), InputError);
    CHECK(choose(AttentionKind::materialized, Precision::bf16, 64).path ==
          AttentionKind::materialized);
  }

  // T = 1, 7, 64, 65, 257 at heads 1 and 12 and head sizes 16, 64, 128, and T = 1024 at two of
  // them (the CPU's reference is the slow side), at compare_with_cpu's tolerances.
  TEST_CASE("cuda: cuDNN attention forward and backward against the CPU's tiled attention, bf16") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::vector<AttentionShape> shapes;
    for (int T : {1, 7, 64, 65, 257})
      for (int heads : {1, 12})
        for (int d : {16, 64, 128}) shapes.push_back({T < 64 ? 3 : 2, T, heads, d});
    shapes.push_back({1, 1024, 1, 128});
    shapes.push_back({1, 1024, 12, 64});
    // Grouped-query attention, cuDNN's native K and V of fewer heads: multi-query, 2 groups of
    // 3, and a SmolLM2-135M-shaped layer (9 heads on 3, D 64).
    for (int T : {7, 65, 257})
      for (int kv_heads : {1, 2}) shapes.push_back({2, T, 6, 64, kv_heads});
    shapes.push_back({2, 512, 9, 64, 3});
    for (const AttentionShape s : shapes) {
      CAPTURE(fmt::format("B={} T={} H={} Hkv={} D={}", s.batch, s.T, s.heads, kv_heads_of(s),
                          s.head_size));
      const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
      const std::size_t width = std::size_t(qkv_width(s));
      if (s.T == 1) {
        // Refused by the rule (a model of context 1 runs materialised: the case above), and by
        // the device with that reason, before cuDNN is asked; the other shapes go on.
        auto qkv16 = on_device(*gpu, std::vector<std::uint16_t>(n * width));
        auto y16 = on_device(*gpu, std::vector<std::uint16_t>(n * c));
        auto lse = on_device(*gpu, std::vector<float>(std::size_t(s.batch) * s.heads));
        auto dqkv = on_device(*gpu, std::vector<float>(n * width));
        CHECK_THROWS_WITH_AS(
            gpu->attention_forward(s, {nullptr, qkv16.data()}, {nullptr, y16.data()}, lse.data()),
            doctest::Contains("s_q = s_kv = 1"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(gpu->attention_backward(s, {nullptr, qkv16.data()},
                                                     {nullptr, y16.data()}, {nullptr, y16.data()},
                                                     lse.data(), dqkv.data()),
                             doctest::Contains("s_q = s_kv = 1"), std::invalid_argument);
        continue;
      }
      compare_with_cpu(*gpu, s, {}, 500 + s.T);
    }
  }

  // Packed windows (Note [cuDNN packed mask]): cuDNN with the bias its kernel writes against the
  // CPU's tiled attention with the same positions, in bf16 (compare_with_cpu). Each window
  // is cut into sequences of random lengths (1 position among them, and one sequence filling
  // a window), so that a row reading a key of an earlier sequence, or missing one of its own,
  // moves y, the log-sum-exp and every gradient past them.
  TEST_CASE("cuda: cuDNN attention with packed sequences against the CPU's tiled attention") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::vector<AttentionShape> shapes{{3, 64, 2, 64}, {2, 257, 12, 64}, {2, 512, 9, 64, 3},
                                       {2, 1024, 4, 128}};
    std::uint64_t seed = 77;
    for (AttentionShape s : shapes) {
      CAPTURE(fmt::format("B={} T={} H={} Hkv={} D={}", s.batch, s.T, s.heads, kv_heads_of(s),
                          s.head_size));
      const std::size_t n = std::size_t(s.batch) * s.T;
      // Positions: window 0 one sequence; the others cut where a random draw says.
      std::vector<std::int32_t> positions(n);
      int sequences = 0;
      for (int b = 0; b < s.batch; ++b) {
        int p = 0;
        for (int t = 0; t < s.T; ++t) {
          seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
          const bool cut = b > 0 && t > 0 && (seed >> 33) % 23 == 0;
          p = t == 0 || cut ? 0 : p + 1;
          sequences += p == 0;
          positions[std::size_t(b) * s.T + t] = p;
        }
      }
      CAPTURE(sequences);
      REQUIRE(sequences > s.batch + 2);
      compare_with_cpu(*gpu, s, positions, 900 + s.T);
    }
  }

  // One GPT bf16 step at a small GPT-2-like shape (head size 64), the fused path against the
  // materialised one on the same GPU: the loss within a bf16 ulp; every gradient tensor element
  // by element, within 4 bf16 ulps of itself and of its tensor's largest (the two paths round at
  // different points, Note [bf16 compute]), NaN refused: a backward that wrote NaN, or zeros for
  // dq and dk, fails in c_attn's weight gradient and every tensor below it.
  TEST_CASE("cuda: a GPT's bf16 step with cuDNN attention matches the materialised path") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const GptSpec spec{.vocab_size = 512, .context = 256, .n_layer = 2, .n_head = 4,
                       .d_model = 256};
    const int batch = 4, rows = batch * spec.context;
    auto x = on_device(*gpu, random_tokens(std::size_t(rows), spec.vocab_size, 70));
    std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) labels[r] = (r * 13 + 5) % spec.vocab_size;
    auto y = on_device(*gpu, labels);
    const auto step = [&](AttentionKind path) {
      const Model model = Model::gpt(spec, path);
      Replica replica(*gpu, model, batch, Precision::bf16);
      replica.load_parameters(model.initial_parameters(3));
      const int classes = model.outputs() / spec.context;
      DeviceArray<float> dlogits(*gpu, std::size_t(rows) * classes);
      const LossStats loss = gpu->softmax_cross_entropy(
          replica.forward(x.data(), batch), y.data(), rows, classes, dlogits.data(), 1.0f / rows);
      replica.zero_grads();
      replica.backward(x.data(), dlogits.data(), batch);
      return std::pair{loss.loss_sum / rows, replica.gradients()};
    };
    const auto [fused_loss, fused_grads] = step(AttentionKind::fused);
    const auto [loss, grads] = step(AttentionKind::materialized);
    CHECK(std::abs(fused_loss - loss) <= kBf16Ulp * std::abs(loss));
    check_each_tensor(Model::gpt(spec), fused_grads, grads,
                      {4 * kBf16Ulp, 4 * kBf16Ulp, 0});
  }
#else
  // Note [Skip kinds]: a build without cuDNN's attention is a set-up choice, unless the
  // configure was told to require it (CI's).
  TEST_CASE("cuda: cuDNN attention (not in this build)") {
    skip(LOCKSTEP_TEST_REQUIRE_CUDNN_ATTENTION ? Skip::unbuilt : Skip::setup,
         "this build has no cuDNN fused attention (cuDNN or its frontend was not found when it "
         "was configured)");
  }
#endif
}
