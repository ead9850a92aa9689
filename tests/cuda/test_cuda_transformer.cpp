// The CUDA backend's transformer kernels against the CPU device, on fresh random inputs: outputs
// the kernel overwrites start as NaN (an element never written fails), buffers it accumulates
// into start random. Shapes include odd channel counts (not a multiple of 32), T = 1 and T = 37,
// and GPT-2 124M's own sizes. Embedding is compared bit for bit (both sides do the same float
// additions in the same order); the rest element by element within a tolerance fit for fp32,
// or TF32, and the length of the sums behind each value (Note [Comparing with the CPU]).
// Without a CUDA build or a usable GPU every test says "skipping", and CTest reports it skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "common/random.hpp"
#include "gpu_vs_cpu.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {


// (m, n, k, count)
using GemmShape = std::tuple<int, int, int, int>;

// Every transpose, padded leading dimensions, gaps between the matrices (NaN in every padding
// and gap, so reading one fails), alpha and beta, and beta = 0 over a NaN C (must not be read).
// tolerance(terms, row): fp32_sums or tf32_sums.
void check_gemm_batched(Device& gpu, const std::vector<GemmShape>& shapes,
                        Tolerance (*tolerance)(double terms, std::size_t row)) {
  std::uint64_t seed = 100;
  for (Transpose ta : {Transpose::no, Transpose::yes})
    for (Transpose tb : {Transpose::no, Transpose::yes})
      for (auto [m, n, k, count] : shapes) {
        CAPTURE(int(ta));
        CAPTURE(int(tb));
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(count);
        const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
        const int a_rows = at ? k : m, a_cols = at ? m : k;
        const int b_rows = bt ? n : k, b_cols = bt ? k : n;
        const int lda = std::max(1, a_cols + 2), ldb = std::max(1, b_cols + 3), ldc = n + 1;
        const std::int64_t stride_a = std::int64_t(a_rows) * lda + 5;
        const std::int64_t stride_b = std::int64_t(b_rows) * ldb + 1;
        const std::int64_t stride_c = std::int64_t(m) * ldc + 7;
        // count matrices of rows x cols with leading dimension ld, `stride` apart; NaN elsewhere.
        const auto batch = [&](int rows, int cols, int ld, std::int64_t stride) {
          std::vector<float> v(static_cast<std::size_t>(stride * count), kNaN);
          const auto values = random_floats(v.size(), seed += 3);
          for (int i = 0; i < count; ++i)
            for (int r = 0; r < rows; ++r)
              for (int c = 0; c < cols; ++c) {
                const auto e = static_cast<std::size_t>(i * stride + r * ld + c);
                v[e] = values[e];
              }
          return v;
        };
        const auto a = batch(a_rows, a_cols, lda, stride_a);
        const auto b = batch(b_rows, b_cols, ldb, stride_b);
        const auto c0 = batch(m, n, ldc, stride_c);
        compare(
            gpu,
            [&](Device& d) {
              auto ad = on_device(d, a), bd = on_device(d, b), cd = on_device(d, c0);
              d.gemm_batched(ta, tb, m, n, k, 0.75f, ad.data(), lda, stride_a, bd.data(), ldb,
                             stride_b, -0.5f, cd.data(), ldc, stride_c, count);
              // beta = 0: NaN in C on the GPU, zeros on the CPU (whose BLAS we do not test);
              // NaN in the padding and gaps on both.
              const float unread = d.backend() == "cuda" ? kNaN : 0.0f;
              std::vector<float> fresh(c0.size());
              for (std::size_t i = 0; i < fresh.size(); ++i)
                fresh[i] = std::isnan(c0[i]) ? kNaN : unread;
              auto zd = on_device(d, fresh);
              d.gemm_batched(ta, tb, m, n, k, 1.0f, ad.data(), lda, stride_a, bd.data(), ldb,
                             stride_b, 0.0f, zd.data(), ldc, stride_c, count);
              return Outputs{cd.download(), zd.download()};
            },
            tolerance(k + 1, std::size_t(ldc)), NaNs::where_cpu_has_them);  // padding and gaps
      }
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("transformer: add, out of place and in place") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (std::size_t n : {1u, 1000u, 1048583u}) {
      CAPTURE(n);
      const auto a = random_floats(n, n + 1), b = random_floats(n, n + 2);
      compare(
          *gpu,
          [&](Device& d) {
            auto ad = on_device(d, a), bd = on_device(d, b);
            auto yd = poisoned(d, n);
            d.add(ad.data(), bd.data(), yd.data(), n);
            d.add(ad.data(), bd.data(), bd.data(), n);  // y aliases b
            d.add(ad.data(), bd.data(), ad.data(), n);  // y aliases a: a + (a + b)
            return Outputs{yd.download(), bd.download(), ad.download()};
          },
          kSameBits);
    }
  }

  TEST_CASE("transformer: gemm_batched for every transpose, padding, strides, alpha and beta") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    check_gemm_batched(*gpu,
                       {{1, 1, 1, 1}, {7, 5, 3, 3}, {13, 17, 11, 1}, {37, 37, 16, 4},
                        {2, 300, 70, 5}, {64, 10, 0, 2}},
                       fp32_sums);
    // count = 0 and empty products do nothing; bad shapes are refused as on the CPU.
    auto c = poisoned(*gpu, 4);
    gpu->gemm_batched(Transpose::no, Transpose::no, 2, 2, 2, 1.0f, nullptr, 2, 4, nullptr, 2, 4,
                      0.0f, c.data(), 2, 4, 0);
    CHECK(std::isnan(c.download()[0]));
    CHECK_THROWS_AS(gpu->gemm_batched(Transpose::no, Transpose::no, 2, 2, 2, 1.0f, nullptr, 2, 4,
                                      nullptr, 2, 4, 0.0f, c.data(), 2, 4, -1),
                    std::invalid_argument);
    CHECK_THROWS_AS(gpu->gemm_batched(Transpose::no, Transpose::no, 2, 3, 2, 1.0f, nullptr, 2, 4,
                                      nullptr, 2, 4, 0.0f, c.data(), 2, 4, 1),
                    std::invalid_argument);  // ldb < n
  }

  TEST_CASE("transformer: gemm_batched with TF32 tensor cores") {
    auto backend = cuda_or_skip({.precision = Precision::tf32});
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // TF32 keeps 10 mantissa bits of each operand: about 1e-3 relative error per product.
    check_gemm_batched(*gpu, {{7, 5, 3, 3}, {37, 37, 16, 4}, {2, 300, 70, 5}}, tf32_sums);
  }

  // Frozen tables held in bf16 only (Note [Frozen parameters] in src/model/lora.cpp): wte alone
  // (a Llama's), and wte + wpe (GPT-2's), at t or at packed positions.
  TEST_CASE("transformer: embedding forward from bf16 tables, bit-identical to the CPU") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 300;
    for (auto [vocab, batch, T, C] : {std::tuple{1, 3, 37, 33}, {5, 3, 1, 7}, {11, 4, 37, 45},
                                      {50257, 4, 64, 40}}) {
      CAPTURE(vocab);
      CAPTURE(C);
      const int t_max = T + 2;
      const std::size_t rows = std::size_t(batch) * T, nc = std::size_t(C);
      const auto ids = random_tokens(rows, vocab, seed += 5);
      const auto wte = random_floats(std::size_t(vocab) * nc, seed += 5);
      const auto wpe = random_floats(std::size_t(t_max) * nc, seed += 5);
      std::vector<std::int32_t> packed(rows);
      for (std::size_t r = 0; r < rows; ++r)
        packed[r] = int(r % std::size_t(T)) % (5 + int(r / std::size_t(T)) % 3);
      for (const int mode : {0, 1, 2}) {  // no wpe, wpe at t, wpe at packed positions
        CAPTURE(mode);
        compare(
            *gpu,
            [&](Device& d) {
              auto idd = on_device(d, ids), wted = on_device(d, wte), wped = on_device(d, wpe);
              auto posd = on_device(d, packed);
              DeviceArray<std::uint16_t> wte16(d, wte.size()), wpe16(d, wpe.size());
              d.to_bf16(wted.data(), wte16.data(), wte.size());
              d.to_bf16(wped.data(), wpe16.data(), wpe.size());
              auto out = poisoned(d, rows * nc);
              d.embedding_forward(idd.data(), wte16.data(), mode ? wpe16.data() : nullptr,
                                  out.data(), batch, T, C, mode == 2 ? posd.data() : nullptr);
              return Outputs{out.download()};
            },
            kSameBits);
      }
    }
  }

  // Packed windows too (positions restarting inside a window, Note [Packed attention]): wpe read
  // at each row's position, and dwpe summed per position in row order, as the CPU does.
  TEST_CASE("transformer: embedding forward and backward, bit-identical to the CPU") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 200;
    // (V, batch, T, C): one token only (every row in one run), T = 1, odd C, T = 37, and a
    // large vocabulary where most tokens appear once.
    for (auto [vocab, batch, T, C] : {std::tuple{1, 3, 37, 33}, {1, 1, 1, 1}, {5, 3, 1, 7},
                                      {11, 4, 37, 45}, {50, 2, 128, 768}, {50257, 4, 64, 40}}) {
      CAPTURE(vocab);
      CAPTURE(batch);
      CAPTURE(T);
      CAPTURE(C);
      const int t_max = T + 2;  // wpe has rows beyond T, unused
      const std::size_t rows = std::size_t(batch) * T, nc = std::size_t(C);
      const auto ids = random_tokens(rows, vocab, seed += 5);
      const auto wte = random_floats(std::size_t(vocab) * nc, seed += 5);
      const auto wpe = random_floats(std::size_t(t_max) * nc, seed += 5);
      const auto dout = random_floats(rows * nc, seed += 5);
      // Sequences cut every 5 + (b mod 3) positions.
      std::vector<std::int32_t> packed(rows);
      for (std::size_t r = 0; r < rows; ++r)
        packed[r] = int(r % std::size_t(T)) % (5 + int(r / std::size_t(T)) % 3);
      for (const bool pack : {false, true}) {
        CAPTURE(pack);
        compare(
            *gpu,
            [&](Device& d) {
              auto idd = on_device(d, ids), wted = on_device(d, wte), wped = on_device(d, wpe);
              auto posd = on_device(d, packed);
              const std::int32_t* positions = pack ? posd.data() : nullptr;
              auto out = poisoned(d, rows * nc);
              d.embedding_forward(idd.data(), wted.data(), wped.data(), out.data(), batch, T, C,
                                  positions);
              auto doutd = on_device(d, dout);
              d.embedding_backward(idd.data(), doutd.data(), wted.data(), wped.data(), batch, T,
                                   C, positions);
              return Outputs{out.download(), wted.download(), wped.download()};
            },
            kSameBits);
      }
    }
    auto x = poisoned(*gpu, 4);
    CHECK_THROWS_AS(
        gpu->embedding_forward(x.data(), x.data(), x.data(), x.data(), -1, 2, 2, nullptr),
        std::invalid_argument);
    DeviceArray<std::uint16_t> x16(*gpu, 4);
    CHECK_THROWS_AS(gpu->embedding_forward(x.data(), x16.data(), nullptr, x.data(), 1, -2, 2,
                                           nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(
        gpu->embedding_backward(x.data(), x.data(), x.data(), x.data(), 1, 2, -2, nullptr),
        std::invalid_argument);
  }

  TEST_CASE("transformer: layernorm forward and backward, deterministic") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 300;
    // (rows, C): C = 1, odd C, one row, and more rows than one partial of dweight / dbias.
    for (auto [rows, C] : {std::pair{1, 1}, {1, 768}, {7, 31}, {37, 100}, {300, 768},
                           {600, 33}, {1030, 67}}) {
      CAPTURE(rows);
      CAPTURE(C);
      const std::size_t n = std::size_t(rows) * C;
      const auto x = random_floats(n, seed += 7, -2.0, 3.0);
      const auto weight = random_floats(C, seed += 7), bias = random_floats(C, seed += 7);
      const auto dy = random_floats(n, seed += 7);
      const auto dx0 = random_floats(n, seed += 7);
      const auto dw0 = random_floats(C, seed += 7), db0 = random_floats(C, seed += 7);
      const auto run = [&](Device& d) {
        auto xd = on_device(d, x), wd = on_device(d, weight), bd = on_device(d, bias);
        auto y = poisoned(d, n), mean = poisoned(d, rows), rstd = poisoned(d, rows);
        d.layernorm_forward(xd.data(), wd.data(), bd.data(), y.data(), mean.data(), rstd.data(),
                            rows, C);
        auto dyd = on_device(d, dy), dx = on_device(d, dx0);
        auto dw = on_device(d, dw0), db = on_device(d, db0);
        d.layernorm_backward(xd.data(), wd.data(), mean.data(), rstd.data(), dyd.data(),
                             dx.data(), dw.data(), db.data(), rows, C);
        return Outputs{y.download(),  mean.download(), rstd.download(),
                       dx.download(), dw.download(),   db.download()};
      };
      // Sums over a row (C) and, for dweight and dbias, over the rows.
      compare(*gpu, run, fp32_sums(std::max(rows, C) + 4, std::size_t(C)));
      const Outputs first = run(*gpu), second = run(*gpu);
      for (std::size_t k = 0; k < first.size(); ++k) {
        CAPTURE(k);
        CHECK(std::memcmp(first[k].data(), second[k].data(), first[k].size() * sizeof(float)) ==
              0);
      }
    }
  }

  TEST_CASE("transformer: causal softmax forward and backward, out of place and in place") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 400;
    for (auto [count, T] : {std::pair{1, 1}, {3, 1}, {2, 37}, {3, 64}, {1, 200}, {2, 1024}}) {
      CAPTURE(count);
      CAPTURE(T);
      const std::size_t n = std::size_t(count) * T * T;
      const float scale = 0.125f;  // 1 / sqrt(64)
      const auto s = random_floats(n, seed += 3, -8.0, 8.0);
      const auto dp = random_floats(n, seed += 3);
      const SoftmaxTolerance tol = softmax_tolerance(T, /*bf16=*/false);
      compare_each(*gpu, [&](Device& d) {
        auto sd = on_device(d, s), p = poisoned(d, n);
        d.causal_softmax_forward(sd.data(), p.data(), count, T, scale);
        d.causal_softmax_forward(sd.data(), sd.data(), count, T, scale);  // p aliases s
        auto dpd = on_device(d, dp), ds = poisoned(d, n);
        d.causal_softmax_backward(p.data(), dpd.data(), ds.data(), count, T, scale);
        d.causal_softmax_backward(p.data(), dpd.data(), dpd.data(), count, T, scale);  // in place
        return Outputs{p.download(), sd.download(), ds.download(), dpd.download()};
      }, {tol.p, tol.p, tol.ds, tol.ds});
    }
    auto x = poisoned(*gpu, 4);
    CHECK_THROWS_AS(gpu->causal_softmax_forward(x.data(), x.data(), -1, 2, 1.0f),
                    std::invalid_argument);
  }

  TEST_CASE("transformer: the LM head's padded vocabulary, its loss and gradients") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // V 300 padded to 320 (Note [Padded vocabulary]): -inf written into the padding by a rank-1
    // GEMM on both sides, the real logits, dlogits, dwte and din close to the CPU's.
    constexpr int kVocab = 300, kPadded = 320, kT = 7, kC = 24, kBatch = 3, kRows = kBatch * kT;
    const auto head = make_tied_lm_head(0, kVocab, kT, kC);
    REQUIRE(head->out_features() == kT * kPadded);
    const auto wte = random_floats(std::size_t(kVocab) * kC, 600);
    const auto in = random_floats(std::size_t(kRows) * kC, 601, -2.0, 2.0);
    const auto labels = random_labels(kRows, kVocab, 602);
    compare(*gpu, [&](Device& d) {
      auto wd = on_device(d, wte), xd = on_device(d, in);
      auto yd = on_device(d, labels);
      auto dwte = on_device(d, std::vector<float>(wte.size(), 0.0f));
      auto logits = poisoned(d, std::size_t(kRows) * kPadded);
      auto dlogits = poisoned(d, std::size_t(kRows) * kPadded), din = poisoned(d, in.size());
      DeviceArray<float> saved(d, head->workspace_size(kBatch));
      const LayerWorkspace ws{saved.data(), nullptr};
      head->forward(d, wd.data(), xd.data(), logits.data(), kBatch, ws);
      d.softmax_cross_entropy(logits.data(), yd.data(), kRows, kPadded, dlogits.data(), 0.25f);
      head->backward(d, wd.data(), dwte.data(), xd.data(), logits.data(), dlogits.data(),
                     din.data(), kBatch, ws);
      // The padding apart (-inf logits, zero dlogits on both), the real columns compared.
      const auto z = logits.download(), dz = dlogits.download();
      std::vector<float> real_z, real_dz;
      for (int r = 0; r < kRows; ++r)
        for (int j = 0; j < kPadded; ++j) {
          const std::size_t e = std::size_t(r) * kPadded + j;
          if (j < kVocab) {
            real_z.push_back(z[e]);
            real_dz.push_back(dz[e]);
          } else {
            REQUIRE(z[e] == -std::numeric_limits<float>::infinity());
            REQUIRE(dz[e] == 0.0f);
          }
        }
      return Outputs{real_z, real_dz, dwte.download(), din.download()};
    }, fp32_sums(kVocab + kC + 4, kVocab));  // a product over C, a softmax over V
  }

  TEST_CASE("transformer: the LM head fused with the loss, chunk by chunk, against the CPU") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // 300 rows: chunks of 256 and 44 (Note [Chunked classifier]); V 300 padded to 320; every
    // seventh label ignored. The loss, dwte and din close to the CPU's.
    constexpr int kVocab = 300, kT = 100, kC = 24, kBatch = 3, kRows = kBatch * kT;
    const auto head = make_tied_lm_head(0, kVocab, kT, kC);
    REQUIRE(head->fuses_loss());
    const auto wte = random_floats(std::size_t(kVocab) * kC, 610);
    const auto in = random_floats(std::size_t(kRows) * kC, 611, -2.0, 2.0);
    auto labels = random_labels(kRows, kVocab, 612);
    for (int r = 0; r < kRows; r += 7) labels[std::size_t(r)] = kIgnoreLabel;
    compare(*gpu, [&](Device& d) {
      auto wd = on_device(d, wte), xd = on_device(d, in);
      auto yd = on_device(d, labels);
      auto dwte = on_device(d, std::vector<float>(wte.size(), 0.0f));
      auto din = poisoned(d, in.size());
      DeviceArray<float> saved(d, head->workspace_size(kBatch)),
          scratch(d, head->scratch_size(kBatch));
      DeviceArray<LossStats> stats(d, 1);
      head->forward_loss(d, wd.data(), dwte.data(), xd.data(), din.data(),
                         {.labels = yd.data(), .grad_scale = 0.25f, .stats = stats.data()},
                         kBatch, LayerWorkspace{saved.data(), scratch.data()});
      const LossStats s = stats.download().front();
      REQUIRE(s.label_error == 0);
      return Outputs{{static_cast<float>(s.loss_sum)}, {static_cast<float>(s.correct)},
                     dwte.download(), din.download()};
    }, fp32_sums(kVocab + kC + 4, kVocab));
  }

  TEST_CASE("transformer: the LM head fused with the loss under bf16, chunk by chunk, tied and "
            "untied, against the CPU") {
    // The bf16 path of Note [Chunked classifier]: each chunk's logits from the bf16 products,
    // rounded to bf16, the fused classifier in place over them, and the products of backward
    // from the bf16 gradient. 300 rows: chunks of 256 and 44; every seventh label ignored. Both
    // sides round the same fp32 sums to bf16, which may land on neighbours: the gradients within
    // a few bf16 ulps of their row's largest.
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    constexpr int kVocab = 300, kT = 100, kC = 24, kBatch = 3, kRows = kBatch * kT;
    for (const bool tied : {true, false}) {
      CAPTURE(tied);
      const auto head = tied ? make_tied_lm_head(0, kVocab, kT, kC) : make_lm_head(kVocab, kT, kC);
      REQUIRE(head->fuses_loss());
      const auto w = random_floats(std::size_t(kVocab) * kC, 620);
      const auto in = random_floats(std::size_t(kRows) * kC, 621, -2.0, 2.0);
      auto labels = random_labels(kRows, kVocab, 622);
      for (int r = 0; r < kRows; r += 7) labels[std::size_t(r)] = kIgnoreLabel;
      std::vector<LossStats> stats;
      compare(*gpu, [&](Device& d) {
        auto wd = on_device(d, w), xd = on_device(d, in);
        auto w16 = on_device(d, to_bits(w));
        auto yd = on_device(d, labels);
        auto dw = on_device(d, std::vector<float>(w.size(), 0.0f));
        auto din = poisoned(d, in.size());
        DeviceArray<float> saved(d, head->workspace_size(kBatch, Precision::bf16)),
            scratch(d, head->scratch_size(kBatch, Precision::bf16));
        DeviceArray<LossStats> acc(d, 1);
        head->forward_loss(d, wd.data(), dw.data(), xd.data(), din.data(),
                           {.labels = yd.data(), .grad_scale = 1.0f / kRows, .stats = acc.data()},
                           kBatch,
                           LayerWorkspace{.saved = saved.data(), .scratch = scratch.data(),
                                          .precision = Precision::bf16,
                                          .params_bf16 = w16.data()});
        stats.push_back(acc.download().front());
        REQUIRE(stats.back().label_error == 0);
        return Outputs{dw.download(), din.download()};
      }, Tolerance{.rel = 4 * kBf16Ulp, .abs = 16 * kBf16Ulp, .row = std::size_t(kC)});
      CHECK(stats[1].correct == stats[0].correct);
      CHECK(stats[1].loss_sum == doctest::Approx(stats[0].loss_sum).epsilon(1e-3));
    }
  }

  TEST_CASE("transformer: GPT-2 124M sizes (C 768, V 50257, T 1024, 12 heads)") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    constexpr int kVocab = 50257, kC = 768, kT = 1024, kBatch = 2, kHeads = 12, kHead = kC / kHeads;
    const std::size_t rows = std::size_t(kBatch) * kT;
    SUBCASE("embedding") {
      const auto ids = random_tokens(rows, kVocab, 500);
      const auto wte = random_floats(std::size_t(kVocab) * kC, 501);
      const auto wpe = random_floats(std::size_t(kT) * kC, 502);
      const auto dout = random_floats(rows * kC, 503);
      compare(
          *gpu,
          [&](Device& d) {
            auto idd = on_device(d, ids), wted = on_device(d, wte), wped = on_device(d, wpe);
            auto out = poisoned(d, rows * kC), doutd = on_device(d, dout);
            d.embedding_forward(idd.data(), wted.data(), wped.data(), out.data(), kBatch, kT, kC,
                                nullptr);
            d.embedding_backward(idd.data(), doutd.data(), wted.data(), wped.data(), kBatch, kT,
                                 kC, nullptr);
            return Outputs{out.download(), wted.download(), wped.download()};
          },
          kSameBits);
    }
    SUBCASE("layernorm") {
      const auto x = random_floats(rows * kC, 510, -2.0, 3.0);
      const auto wb = random_floats(2 * kC, 511), dy = random_floats(rows * kC, 512);
      compare(*gpu, [&](Device& d) {
        auto xd = on_device(d, x), wbd = on_device(d, wb), dyd = on_device(d, dy);
        auto y = poisoned(d, rows * kC), mean = poisoned(d, rows), rstd = poisoned(d, rows);
        const float* w = wbd.data();
        d.layernorm_forward(xd.data(), w, w + kC, y.data(), mean.data(), rstd.data(), int(rows),
                            kC);
        DeviceArray<float> dx(d, rows * kC), dwb(d, 2 * kC);
        d.layernorm_backward(xd.data(), w, mean.data(), rstd.data(), dyd.data(), dx.data(),
                             dwb.data(), dwb.data() + kC, int(rows), kC);
        return Outputs{y.download(), dx.download(), dwb.download()};
      }, fp32_sums(rows + 4, kC));  // dweight and dbias sum over the rows
    }
    SUBCASE("attention: q k^T per head, causal softmax, then times v") {
      // q, k, v (heads, T, head size) of one sequence; scores (heads, T, T).
      const int heads = 2;  // of the 12: enough to cross matrices, cheap on the CPU
      const std::size_t qkv = std::size_t(heads) * kT * kHead, tt = std::size_t(kT) * kT;
      const auto q = random_floats(qkv, 520), k = random_floats(qkv, 521);
      const auto v = random_floats(qkv, 522);
      compare(
          *gpu,
          [&](Device& d) {
            auto qd = on_device(d, q), kd = on_device(d, k), vd = on_device(d, v);
            DeviceArray<float> att(d, heads * tt), out(d, qkv);  // beta = 0: zeros, not NaN
            d.gemm_batched(Transpose::no, Transpose::yes, kT, kT, kHead, 1.0f, qd.data(), kHead,
                           std::int64_t(kT) * kHead, kd.data(), kHead, std::int64_t(kT) * kHead,
                           0.0f, att.data(), kT, std::int64_t(tt), heads);
            d.causal_softmax_forward(att.data(), att.data(), heads, kT, 0.125f);
            d.gemm_batched(Transpose::no, Transpose::no, kT, kHead, kT, 1.0f, att.data(), kT,
                           std::int64_t(tt), vd.data(), kHead, std::int64_t(kT) * kHead, 0.0f,
                           out.data(), kHead, std::int64_t(kT) * kHead, heads);
            return Outputs{att.download(), out.download()};
          },
          // q k^T over 64, the softmax and p v over 1024; rows of T.
          fp32_sums(kHead + kT + 4, kT));
    }
  }
}
