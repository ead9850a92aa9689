// The LM head of a decoder: logits of every position over the (padded) vocabulary, from the
// token embedding's weight (tied) or a weight of its own.
//
// Invariants (as every layer): stateless; backward accumulates into parameter gradients (+=) and
// overwrites din (=).
#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/model.hpp"
#include "model/ops.hpp"

namespace lockstep {
namespace {

using detail::Carver;

// Note [Padded vocabulary]
// The logits of a position are a row of P = V rounded up to a multiple of kVocabAlign floats
// (GPT-2: 50257 -> 50304, as nanoGPT and llm.c pad it), so that every row of the logits and of
// their gradient starts 256-byte aligned and the LM head's GEMMs get aligned leading dimensions.
// Only the logits are padded, not wte: the GEMMs compute the V real columns into rows of stride
// P, and the P - V padding columns are set to -inf. softmax_cross_entropy then gives them no
// mass (exp(-inf) = 0 adds nothing to any sum), argmax never picks them, their dlogits are
// exactly 0 and no GEMM reads them; the sampler looks at the V real ones only. The parameters,
// checkpoints and exports keep their unpadded layout, bit for bit, and the loss is the unpadded
// model's (the padding adds exact zeros to its sums).
constexpr int kVocabAlign = 64;

int padded_vocab(int vocab) { return (vocab + kVocabAlign - 1) / kVocabAlign * kVocabAlign; }

// Its weight W (V, C): tied to the embedding layer, the first V * C of that layer's parameters
// (its wte, GPT-2's and tied Llamas'), or a weight of its own (an untied Llama's lm_head.weight,
// N(0, 0.02)). in (B, T * C), out (B, T * P) logits = in W^T per position, -inf in the padding.
class LmHead final : public Layer {
 public:
  // embedding_layer: the layer whose weight it reads, or -1 for a weight of its own.
  LmHead(int embedding_layer, int vocab, int context, int channels)
      : tied_(embedding_layer), v_(vocab), p_(padded_vocab(vocab)), t_(context), c_(channels) {}

  std::string_view kind() const noexcept override { return "lm_head"; }
  int in_features() const noexcept override { return t_ * c_; }
  int out_features() const noexcept override { return t_ * p_; }
  int tied_to() const noexcept override { return tied_; }
  std::size_t param_count() const noexcept override {
    return tied_ >= 0 ? 0 : std::size_t(v_) * std::size_t(c_);
  }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    if (tied_ >= 0) return {};
    return {{prefix + ".weight", 0, {v_, c_}}};
  }
  void init_parameters(float* params, std::uint64_t& rng) const override {
    detail::fill_normal(params, param_count(), detail::kInitStd, rng);
  }
  int vocab_padding() const noexcept override { return p_ - v_; }
  // No bias: the gradient of the logits feeds the two matrix products only.
  bool dout_bf16() const noexcept override { return true; }
  std::size_t workspace_size(int batch, Precision /*precision*/) const noexcept override {
    return Saved::at(nullptr, batch * t_, p_ - v_).size;
  }
  // A chunk of logits and under bf16 the input rounded (Chunk), working memory of one call:
  // scratch, shared with the other layers (a GPT-2 block's backward needs more).
  std::size_t scratch_size(int batch, Precision precision) const noexcept override {
    return Chunk::at(nullptr, batch * t_, p_, c_, precision == Precision::bf16).size;
  }

  // bf16 with ws.out_bf16: the logits rounded to bf16 there, computed in fp32 kChunkRows rows
  // at a time, so that no fp32 copy of them exists in full (Note [Fused classifier] in
  // src/cpu/ops/softmax.cpp); `out` is left alone.
  void forward(Device& dev, const float* wte, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    const int n = batch * t_;
    const Saved s = Saved::at(ws.saved, n, p_ - v_);
    const Chunk chunk = Chunk::at(ws.scratch, n, p_, c_, ws.precision == Precision::bf16);
    const MatIn x = detail::as_input(dev, in, chunk.in16, std::size_t(n) * c_);
    const MatIn w = detail::param_input(wte, ws, 0);
    if (!ws.out_bf16) return logits(dev, x, w, s, out, n);
    for (int r = 0; r < n; r += kChunkRows) {
      const int rows = std::min(kChunkRows, n - r);
      logits(dev, x + std::int64_t(r) * c_, w, s, chunk.f32, rows);
      dev.to_bf16(chunk.f32, ws.out_bf16 + std::size_t(r) * p_, std::size_t(rows) * p_);
    }
  }
  // dwte (V, C) += dout^T (V, N) in (N, C); din (N, C) = dout (N, V) wte (V, C); dout's rows
  // have stride P, and its padding (zero) is never read. bf16: reads ws.dout_bf16 instead, the
  // gradient rounded by whoever computed it (the loss, or Replica::backward), and `in` rounded
  // again into the scratch, the bits forward's products read (nothing of it is kept between
  // the calls: Note [Head input] in src/model/model.cpp).
  void backward(Device& dev, const float* wte, float* dwte, const float* in, const float* /*out*/,
                const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    const int n = batch * t_;
    const bool bf16 = ws.precision == Precision::bf16;
    if (bf16 && !ws.dout_bf16)
      throw std::logic_error("lm_head: bf16 backward needs LayerWorkspace::dout_bf16");
    const MatIn dy = bf16 ? MatIn{nullptr, ws.dout_bf16} : MatIn{dout, nullptr};
    if (dwte) {  // null: the weight is frozen (Note [Frozen parameters] in lora.cpp)
      const Chunk chunk = Chunk::at(ws.scratch, n, p_, c_, bf16);
      const MatIn x = detail::as_input(dev, in, chunk.in16, std::size_t(n) * c_);
      detail::matmul(dev, Transpose::yes, Transpose::no, v_, c_, n, dy, p_, x, c_, 1.0f, dwte, c_);
    }
    if (din)
      detail::matmul(dev, Transpose::no, Transpose::no, n, c_, v_, dy, p_,
                     detail::param_input(wte, ws, 0), c_, 0.0f, din, c_);
  }

  // Note [Chunked classifier]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A training step never needs all the logits at once: each row's loss and gradient depend on
  // that row alone, and the head's two backward products are sums over rows. So the head and
  // the loss run kChunkRows rows at a time (as Liger-Kernel's fused linear cross-entropy and
  // llm.c's classifier do): for each chunk of x (rows, C),
  //   logits (rows, P) = x W^T, -inf in the padding (Note [Padded vocabulary]), in the fp32
  //     chunk; bf16: rounded into the bf16 chunk, as forward rounds the whole logits;
  //   the fused classifier (Note [Fused classifier] in src/cpu/ops/softmax.cpp) adds the
  //     chunk's loss and correct count and writes dlogits over the chunk, in place;
  //   din rows (rows, C) = dlogits W, and dW (V, C) += dlogits^T x (skipped when W is frozen).
  // The loss scale (Note [Global token mean] in src/train/worker_loop.cpp) is known before the
  // step, so the gradient can be made while the logits are at hand. What remains of the
  // (B T, P) logits and their gradient (GPT-2 at 8 x 1024: 0.82 GB in bf16, 3.3 GB in fp32)
  // is one chunk, 256 x 50304 x 6 bytes = 77 MB in bf16 (51 MB in fp32), working memory of
  // one call: it lives in the scratch every layer shares, which a GPT-2 block's backward
  // already makes larger (144 MiB at 8 x 1024, against the chunk and the head's bf16 input,
  // 74 + 12 MiB: Note [Head input] in src/model/model.cpp), so that it costs GPT-2 nothing.
  // What it guarantees: every row gets the unchunked head's arithmetic (the same products
  // over C and V, the same classifier, the same bf16 roundings), so its loss, dlogits and din
  // differ from the unchunked head's at most where a matrix product blocks a shorter M
  // differently; dW's sum over rows is cut at chunk boundaries. Both are fp32 reorderings of
  // the same products (tests/model/test_chunked_classifier.cpp bounds them, with a row count
  // no chunk divides, tied and untied heads, fp32 and bf16, masked labels: gradients measured
  // within 1e-7 of their largest, allowed 1e-5 (bf16 1e-4)). Each path is deterministic itself,
  // and every training run takes this one: a run stays bit-identical across recompute modes,
  // ZeRO settings and device graphs (the rows' order and the chunks do not depend on them).
  // Its costs: the head's weight gradient is read and written once per chunk (32 times for
  // 8 x 1024 rows): the chunk's product does 2 x 256 flops per 8 bytes of dW moved, plenty on
  // a CPU, near a large GPU's balance point. A bad label is named by its row in the batch (each
  // chunk's call is told its first row), and of several the lowest, as unchunked.
  // Who needs the logits themselves (sampling, a KV cache, Replica::forward for tests and
  // Python) still runs forward(), which writes them all.
  bool fuses_loss() const noexcept override { return true; }
  void forward_loss(Device& dev, const float* wte, float* dwte, const float* in, float* din,
                    const LossInput& loss, int batch, const LayerWorkspace& ws) const override {
    const int n = batch * t_;
    const bool bf16 = ws.precision == Precision::bf16;
    const Saved s = Saved::at(ws.saved, n, p_ - v_);
    const Chunk chunk = Chunk::at(ws.scratch, n, p_, c_, bf16);
    const MatIn x = detail::as_input(dev, in, chunk.in16, std::size_t(n) * c_);
    const MatIn w = detail::param_input(wte, ws, 0);
    for (int r = 0; r < n; r += kChunkRows) {
      const int rows = std::min(kChunkRows, n - r);
      const MatIn xr = x + std::int64_t(r) * c_;
      logits(dev, xr, w, s, chunk.f32, rows);
      if (bf16) {
        dev.to_bf16(chunk.f32, chunk.bf16, std::size_t(rows) * p_);
        dev.softmax_cross_entropy(chunk.bf16, loss.labels + r, rows, p_,
                                  din ? chunk.bf16 : nullptr, loss.grad_scale, loss.stats, r);
      } else {
        dev.softmax_cross_entropy(chunk.f32, loss.labels + r, rows, p_,
                                  din ? chunk.f32 : nullptr, loss.grad_scale, loss.stats, r);
      }
      if (!din) continue;
      const MatIn dy = bf16 ? MatIn{nullptr, chunk.bf16} : MatIn{chunk.f32, nullptr};
      if (dwte)
        detail::matmul(dev, Transpose::yes, Transpose::no, v_, c_, rows, dy, p_, xr, c_, 1.0f,
                       dwte, c_);
      detail::matmul(dev, Transpose::no, Transpose::no, rows, c_, v_, dy, p_, w, c_, 0.0f,
                     din + std::size_t(r) * c_, c_);
    }
  }

  // Note [KV cache]: the logits of the step's positions, fp32; the padding's factors in the
  // scratch.
  bool decodes() const noexcept override { return true; }
  std::size_t decode_scratch_size(int count) const noexcept override {
    return Saved::at(nullptr, count, p_ - v_).size;
  }
  void decode(Device& dev, const float* wte, const float* in, float* out,
              const DecodeStep& step) const override {
    const Saved s = Saved::at(step.scratch, step.count, p_ - v_);
    logits(dev, {in, nullptr}, {wte, nullptr}, s, out, step.count);
  }

 private:
  // Rows of logits a bf16 forward and forward_loss compute at a time (GPT-2: 51 MB in fp32;
  // Note [Chunked classifier]).
  static constexpr int kChunkRows = 256;

  // ones (N) and minus_inf (P - V), the two factors of the padding (none without padding).
  struct Saved {
    float *ones, *minus_inf;
    std::size_t size;
    static Saved at(float* base, int rows, int padding) {
      Carver k(base);
      Saved s{k.take(padding > 0 ? std::size_t(rows) : 0), k.take(std::size_t(padding)), 0};
      s.size = k.used();
      return s;
    }
  };
  // The fp32 logits of a chunk (min(N, kChunkRows), P), and under bf16 the same rounded to
  // bf16, which the fused classifier overwrites with their gradient, and the input rounded to
  // bf16 (N, C), the products' x: working memory of one call (forward, forward_loss or
  // backward), each of which rounds it from `in` itself (Note [Head input] in
  // src/model/model.cpp).
  struct Chunk {
    float* f32;
    std::uint16_t* bf16;
    std::uint16_t* in16;
    std::size_t size;
    static Chunk at(float* base, int rows, int p, int channels, bool bf16) {
      const std::size_t n = std::size_t(std::min(rows, kChunkRows)) * p;
      Carver k(base);
      Chunk c{k.take(n), bf16 ? k.take_bf16(n) : nullptr,
              bf16 ? k.take_bf16(std::size_t(rows) * channels) : nullptr, 0};
      c.size = k.used();
      return c;
    }
  };

  // out (rows, P) = x (rows, C) wte^T in fp32, -inf in the padding.
  void logits(Device& dev, MatIn x, MatIn wte, const Saved& s, float* out, int rows) const {
    detail::matmul(dev, Transpose::no, Transpose::yes, rows, v_, c_, x, c_, wte, c_, 0.0f, out,
                   p_);
    if (p_ == v_) return;
    // The padding (rows, P - V), rows of stride P, = ones (rows, 1) minus_inf (1, P - V): a
    // GEMM is the device's one strided write, and each element is the single product 1 * -inf.
    dev.fill(s.ones, 1.0f, std::size_t(rows));
    dev.fill(s.minus_inf, -std::numeric_limits<float>::infinity(), std::size_t(p_ - v_));
    dev.gemm(Transpose::no, Transpose::no, rows, p_ - v_, 1, 1.0f, s.ones, 1, s.minus_inf,
             p_ - v_, 0.0f, out + v_, p_);
  }

  int tied_, v_, p_, t_, c_;
};

}  // namespace

std::unique_ptr<Layer> make_tied_lm_head(int embedding_layer, int vocab, int context,
                                         int channels) {
  return std::make_unique<LmHead>(embedding_layer, vocab, context, channels);
}
std::unique_ptr<Layer> make_lm_head(int vocab, int context, int channels) {
  return std::make_unique<LmHead>(-1, vocab, context, channels);
}

}  // namespace lockstep
