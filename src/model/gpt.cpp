// GPT-2: the token/position embedding, the transformer block, the final LayerNorm and the tied
// LM head, as layers over flattened sequences.
//
// Notation: B sequences of T positions, C = d_model channels, H heads of D = C / H channels,
// N = B * T rows, V vocabulary entries. A sample is (T * C) floats, so a layer's `batch` is B and
// its rows are N. Every matrix is row-major.
//
// Invariants (as every layer): stateless; backward accumulates into parameter gradients (+=) and
// overwrites din (=). What backward needs from forward is in LayerWorkspace::saved, laid out by
// the layer's Saved struct; backward's temporaries live in the shared LayerWorkspace::scratch.
#include <charconv>
#include <cmath>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/random.hpp"
#include "lockstep/model.hpp"
#include "model/attention.hpp"
#include "model/lora.hpp"
#include "model/lora_targets.hpp"
#include "model/ops.hpp"

namespace lockstep {
namespace {

std::size_t product(std::size_t a, std::size_t b) { return a * b; }

using detail::Carver;
using detail::fill_normal;
using detail::Kept;
using detail::kInitStd;
using detail::LoraAdapter;
using detail::LoraTarget;

// ---- Embedding --------------------------------------------------------------------------------

// Parameters: wte (V, C), then wpe (T, C). in (B, T) token ids as floats, out (B, T * C). Packed
// windows (LayerWorkspace::positions) read wpe at each row's position in its own sequence, so
// positions restart at each one as RoPE's do (Note [Packed attention] in attention.hpp).
class Embedding final : public Layer {
 public:
  Embedding(int vocab, int context, int channels) : v_(vocab), t_(context), c_(channels) {}

  std::string_view kind() const noexcept override { return "embedding"; }
  int in_features() const noexcept override { return t_; }
  int out_features() const noexcept override { return t_ * c_; }
  std::size_t param_count() const noexcept override { return product(v_ + t_, c_); }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    return {{prefix + ".wte.weight", 0, {v_, c_}}, {prefix + ".wpe.weight", product(v_, c_), {t_, c_}}};
  }
  void init_parameters(float* params, std::uint64_t& rng) const override {
    fill_normal(params, param_count(), kInitStd, rng);
  }

  // params null: frozen tables held in bf16 only, read from ws.params_bf16 (Note [Frozen
  // parameters] in lora.cpp); trained ones read their fp32 masters under bf16 too.
  void forward(Device& dev, const float* params, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    if (!params)
      return dev.embedding_forward(in, ws.params_bf16, ws.params_bf16 + product(v_, c_), out,
                                   batch, t_, c_, ws.positions);
    dev.embedding_forward(in, params, params + product(v_, c_), out, batch, t_, c_,
                          ws.positions);
  }
  // Token ids have no gradient: din is ignored. grads null (frozen): nothing to do.
  void backward(Device& dev, const float* /*params*/, float* grads, const float* in,
                const float* /*out*/, const float* dout, float* /*din*/, int batch,
                const LayerWorkspace& ws) const override {
    if (grads)
      dev.embedding_backward(in, dout, grads, grads + product(v_, c_), batch, t_, c_,
                             ws.positions);
  }
  // Note [KV cache]: the position rows from step.start.
  bool decodes() const noexcept override { return true; }
  void decode(Device& dev, const float* params, const float* in, float* out,
              const DecodeStep& step) const override {
    dev.embedding_forward(in, params, params + product(v_ + step.start, c_), out, 1, step.count,
                          c_, nullptr);
  }

 private:
  int v_, t_, c_;
};

// ---- Transformer block ------------------------------------------------------------------------

// x -> res1 = x + attn(ln_1(x)) -> out = res1 + mlp(ln_2(res1)), with
// attn(h) = c_proj(softmax_causal(q k^T / sqrt(D)) v), (q, k, v) = c_attn(h), per head, and
// mlp(h) = c_proj(gelu(c_fc(h))).
// The block's tensors in storage order (nanoGPT's names), for C channels.
enum BlockParam {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kBlockParams
};
std::vector<ParamTensor> block_tensors(const std::string& prefix, std::int64_t c) {
  const std::pair<const char*, std::vector<std::int64_t>> spec[kBlockParams] = {
      {".ln_1.weight", {c}},          {".ln_1.bias", {c}},
      {".attn.c_attn.weight", {3 * c, c}}, {".attn.c_attn.bias", {3 * c}},
      {".attn.c_proj.weight", {c, c}},     {".attn.c_proj.bias", {c}},
      {".ln_2.weight", {c}},          {".ln_2.bias", {c}},
      {".mlp.c_fc.weight", {4 * c, c}},    {".mlp.c_fc.bias", {4 * c}},
      {".mlp.c_proj.weight", {c, 4 * c}},  {".mlp.c_proj.bias", {c}}};
  std::vector<ParamTensor> out;
  std::size_t offset = 0;
  for (const auto& [name, shape] : spec) {
    out.push_back({prefix + name, offset, shape});
    offset += out.back().numel();
  }
  return out;
}

// x -> res1 = x + attn(ln_1(x)) -> out = res1 + mlp(ln_2(res1)), with
// attn(h) = c_proj(softmax_causal(q k^T / sqrt(D)) v), (q, k, v) = c_attn(h), per head, and
// mlp(h) = c_proj(gelu(c_fc(h))).
//
// With LoRA adapters (Note [LoRA] in lora.cpp) the block's parameters are the adapters of its
// targeted projections and the tensors above are its frozen parameters (under bf16 held in bf16
// only: Note [Frozen parameters]); the adapters add into the products' outputs and their input
// gradients. An adapter on c_fc adds into the pre-activation: c_fc's fused product and GELU run
// as the product, the adapter's terms, then GELU on the kept sum, so GELU's backward reads the
// right fc.
//
// Attention runs one of two ways (model.attention): materialised, as gemm_batched products
// around the causal softmax over (B, H, T, T) matrices kept for backward (the reference), or
// fused, as Device::attention_forward/backward, which keep the log-sum-exp (B, H, T) only (Note
// [Tiled attention] in src/cpu/ops/attention.cpp).
class Block final : public Layer {
 public:
  Block(int context, int channels, int heads, int n_layer, AttentionKind attention,
        const LoraSpec& lora = {})
      : t_(context), c_(channels), h_(heads), n_layer_(n_layer),
        fused_(attention == AttentionKind::fused), rank_(lora.enabled() ? lora.rank : 0),
        lora_scale_(lora.enabled() ? lora.scale() : 0.0f),
        lora_dropout_(lora.enabled() ? static_cast<float>(lora.dropout) : 0.0f) {
    if (attention == AttentionKind::automatic)
      throw std::invalid_argument(
          "gpt block: attention 'auto' must be resolved first (choose_attention)");
    const std::vector<ParamTensor> tensors = block_tensors("", c_);
    for (int i = 0; i < kBlockParams; ++i) offsets_[i] = tensors[i].offset;
    count_ = tensors.back().offset + tensors.back().numel();
    if (lora.enabled()) add_targets(lora);
  }

  std::string_view kind() const noexcept override { return "block"; }
  int in_features() const noexcept override { return t_ * c_; }
  int out_features() const noexcept override { return t_ * c_; }
  std::size_t param_count() const noexcept override { return lora() ? lora_count_ : count_; }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    if (lora()) return detail::lora_tensors(prefix, targets_, rank_);
    return block_tensors(prefix, c_);
  }
  std::size_t frozen_count() const noexcept override { return lora() ? count_ : 0; }
  std::vector<ParamTensor> frozen_tensors(const std::string& prefix) const override {
    if (!lora()) return {};
    return block_tensors(prefix, c_);
  }

  // LayerNorms 1 and 0, linear weights N(0, 0.02), biases 0; the two residual projections
  // N(0, 0.02 / sqrt(2 n_layer)). Draws in storage order. With LoRA these are the frozen base's,
  // and the parameters are the adapters (detail::init_lora).
  void init_parameters(float* params, std::uint64_t& rng) const override {
    if (lora())
      detail::init_lora(params, targets_, rank_, rng);
    else
      init_base(params, rng);
  }
  void init_frozen(float* frozen, std::uint64_t& rng) const override {
    if (lora()) init_base(frozen, rng);
  }
  void init_base(float* params, std::uint64_t& rng) const {
    const Params p = at(params);
    const std::size_t c = static_cast<std::size_t>(c_);
    const double proj_std = kInitStd / std::sqrt(2.0 * n_layer_);
    std::fill(params, params + count_, 0.0f);
    std::fill(p.ln1_w, p.ln1_w + c, 1.0f);
    std::fill(p.ln2_w, p.ln2_w + c, 1.0f);
    fill_normal(p.attn_w, 3 * c * c, kInitStd, rng);
    fill_normal(p.attn_proj_w, c * c, proj_std, rng);
    fill_normal(p.fc_w, 4 * c * c, kInitStd, rng);
    fill_normal(p.fc_proj_w, 4 * c * c, proj_std, rng);
  }

  std::size_t workspace_size(int batch, Precision precision) const noexcept override {
    return saved({.precision = precision}, batch).size;
  }
  std::size_t scratch_size(int batch, Precision precision) const noexcept override {
    return scratch({.precision = precision}, batch, /*with_din=*/false).size;
  }
  // With a din, bf16 and fused attention: without a region for the rounded gradients (Note
  // [Backward scratch lifetimes]).
  std::size_t scratch_size_with_din(int batch, Precision precision) const noexcept override {
    return scratch({.precision = precision}, batch, /*with_din=*/true).size;
  }
  // ln_1's and ln_2's outputs, GELU's, and res1 (Note [Recomputation] in src/model/model.cpp).
  std::size_t recomputed_size(int batch, Precision precision) const noexcept override {
    return saved({.precision = precision}, batch).recomputed;
  }
  // The calls forward made, on what it kept: ln_1 of x (mean1 and rstd1 rewritten with their
  // own bits), res1 and ln_2 of it (residual1: c_proj's product of the kept atty with its
  // adapters, then the residual add and the norm, forward's own calls), GELU of fc. On the CPU
  // forward's GELU is that activation_forward on the kept fc (Note [Fused linear]); with an
  // adapter on c_fc, forward's GELU is that call too.
  void recompute(Device& dev, const float* own, const float* x, int batch,
                 const LayerWorkspace& ws) const override {
    const Saved s = saved(ws, batch);
    const Scratch d = scratch(ws, batch);
    const Base base = base_of(dev, own, ws, d);
    const Params& p = base.p;
    const int n = batch * t_, c = c_;
    s.ln1.store([&](auto* y) {
      dev.layernorm_forward(x, p.ln1_w, p.ln1_b, y, s.mean1, s.rstd1, n, c);
    });
    residual1(dev, own, ws, p, base.w, s, d, x, n);
    if (s.fc.bf16)
      dev.activation_forward(Activation::gelu, s.fc.bf16, s.gelu.bf16, elements(n, 4 * c));
    else
      dev.activation_forward(Activation::gelu, s.fc.f32, s.gelu.f32, elements(n, 4 * c));
  }

  // In bf16 the kernels that produce a kept tensor round it as they store it into saved; a
  // matrix product's output (the linear maps', attention's) is computed in fp32 in scratch first.
  void forward(Device& dev, const float* own, const float* x, float* out, int batch,
               const LayerWorkspace& ws) const override {
    const Saved s = saved(ws, batch);
    const Scratch d = scratch(ws, batch);
    const Base base = base_of(dev, own, ws, d);
    const Params& p = base.p;
    const Linears& w = base.w;
    const int n = batch * t_, c = c_;
    const auto adapt = [&](Projection proj, MatIn in, float* y) {
      adapt_forward(dev, own, ws, s, d, proj, in, y, n);
    };
    s.ln1.store([&](auto* y) {
      dev.layernorm_forward(x, p.ln1_w, p.ln1_b, y, s.mean1, s.rstd1, n, c);
    });
    project_forward(dev, own, ws, s, d, {kCAttn, w.attn, c, 3 * c}, s.ln1.input(),
                    s.qkv.output(), d.qkv, n);
    attention_forward(dev, s, d, batch, ws.positions);
    residual1(dev, own, ws, p, w, s, d, x, n);
    // gelu = GELU(fc), fc kept for GELU's backward (Note [Fused linear]); with an adapter on
    // c_fc, fc is the product plus the adapter's terms, and GELU runs on it after.
    if (has_target(kFc)) {
      project_forward(dev, own, ws, s, d, {kFc, w.fc, c, 4 * c}, s.ln2.input(), s.fc.output(),
                      d.h, n);
      if (s.fc.bf16)
        dev.activation_forward(Activation::gelu, s.fc.bf16, s.gelu.bf16, elements(n, 4 * c));
      else
        dev.activation_forward(Activation::gelu, s.fc.f32, s.gelu.f32, elements(n, 4 * c));
    } else {
      dev.linear_forward({.rows = n, .in = c, .out = 4 * c, .x = s.ln2.input(),
                          .weight = w.fc.weight, .bias = w.fc.bias_for(s.fc.output()),
                          .act = FusedActivation::gelu, .pre = s.fc.output(),
                          .y = s.gelu.output(), .product = d.h});
    }
    detail::linear_forward(dev, w.fc_proj, s.gelu.input(), {out, nullptr}, nullptr, n, 4 * c, c);
    adapt(kFcProj, s.gelu.input(), out);
    dev.add(out, s.res1, out, elements(n, c));
  }

  void backward(Device& dev, const float* own, float* grads, const float* x,
                const float* /*out*/, const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    if (lora()) return lora_backward(dev, own, grads, x, dout, din, batch, ws);
    const float* params = own;
    const Params p = at(const_cast<float*>(params));
    const Linears w = linears(params, ws);
    const Params g = at(grads);
    const bool bf16 = ws.precision == Precision::bf16;
    const Saved s = saved(ws, batch);
    const Scratch d = scratch(ws, batch, din != nullptr, din);
    const int n = batch * t_, c = c_;
    // MLP branch: out = res1 + c_proj(gelu(c_fc(ln_2(res1)))). c_proj's backward runs GELU's
    // too, giving the gradient of fc in d.h (and in bf16 rounded into d.grad16, c_fc's products'
    // input) and c_fc's bias gradient; c_fc's backward then needs no dy of its own. Under bf16
    // dout is read rounded from d.dout16: din's storage, or a region of the scratch (Note
    // [Backward scratch lifetimes]).
    const MatIn dout_g = detail::as_input(dev, dout, d.dout16, elements(n, c));
    dev.linear_backward({.rows = n, .in = 4 * c, .out = c, .x = s.gelu.input(),
                         .weight = w.fc_proj.weight, .dy = dout, .g = dout_g,
                         .dweight = g.fc_proj_w, .dbias = g.fc_proj_b, .dx = d.h,
                         .act = FusedActivation::gelu, .pre = s.fc.input(), .dx_bf16 = d.grad16,
                         .dbias_pre = g.fc_b});
    const MatIn dh = bf16 ? MatIn{nullptr, d.grad16} : MatIn{d.h, nullptr};
    dev.linear_backward({.rows = n, .in = c, .out = 4 * c, .x = s.ln2.input(),
                         .weight = w.fc.weight, .g = dh, .dweight = g.fc_w, .dx = d.tmp});
    // d res1 = dout + ln_2's input gradient, in bf16 rounded in the same pass into d.grad16, the
    // input of c_proj's products (Note [Residual LayerNorm]). It is written straight into din,
    // which ln_1's backward then adds to in place (Note [Backward scratch lifetimes]).
    float* dres1 = din ? din : d.res1;
    dev.residual_layernorm_backward(s.res1, p.ln2_w, s.mean2, s.rstd2, d.tmp, dout, dres1,
                                    bf16 ? d.grad16 : nullptr, g.ln2_w, g.ln2_b, n, c);
    // Attention branch: res1 = x + c_proj(attention(c_attn(ln_1(x)))). Under bf16 the gradient
    // of atty is written rounded into d.datty16 (grad16 past d res1's rounding, or the scratch's
    // region, free once c_fc's backward has run), attention's input, by c_proj's product.
    const MatIn dres1_g = bf16 ? MatIn{nullptr, d.grad16} : MatIn{dres1, nullptr};
    dev.linear_backward({.rows = n, .in = c, .out = c, .x = s.atty.input(),
                         .weight = w.attn_proj.weight, .dy = dres1, .g = dres1_g,
                         .dweight = g.attn_proj_w, .dbias = g.attn_proj_b, .dx = d.tmp,
                         .dx_bf16 = bf16 ? d.datty16 : nullptr});
    attention_backward(dev, s, d, batch, ws.positions);
    detail::linear_backward(dev, w.attn, g.attn_w, g.attn_b, s.ln1.input(), d.qkv, d.tmp, n, c,
                            3 * c, d.grad16);
    // din += ln_1's input gradient. ln_1's parameters need its backward even without a din (the
    // block as a first layer): its dx then goes to d.res1, from no residual (d.res1 shares
    // storage with d.qkv, read by now; the parameters' gradients do not read the residual).
    dev.residual_layernorm_backward(x, p.ln1_w, s.mean1, s.rstd1, d.tmp, din, din ? din : d.res1,
                                    nullptr, g.ln1_w, g.ln1_b, n, c);
  }

  // With LoRA: the base's input gradients alone (no weight, bias or LayerNorm gradients, the
  // latter into a discarded sink), each followed by its adapters' (Note [LoRA] in lora.cpp),
  // which add into the input gradient before GELU's backward where c_proj of the MLP has one.
  // Under bf16 the products read the gradients rounded where backward() rounds them (dout,
  // GELU's output gradient, d res1, d atty, d qkv), the adapters' sums included, and the base
  // weights' bf16 bits (Note [Frozen parameters]).
  void lora_backward(Device& dev, const float* own, float* grads, const float* x,
                     const float* dout, float* din, int batch, const LayerWorkspace& ws) const {
    const bool bf16 = ws.precision == Precision::bf16;
    const Saved s = saved(ws, batch);
    const Scratch d = scratch(ws, batch, din != nullptr, din);
    const Base base = base_of(dev, own, ws, d);
    const Params& p = base.p;
    const Linears& w = base.w;
    const int n = batch * t_, c = c_;
    // dx (N, in) = g W, g the output gradient as the products read it; then the adapters on
    // `proj` add theirs.
    const auto project = [&](Projection proj, const detail::LinearParams& map, MatIn in,
                             MatIn g, float* dx, int in_f, int out_f) {
      detail::matmul(dev, Transpose::no, Transpose::no, n, in_f, out_f, g, out_f, map.weight,
                     in_f, 0.0f, dx, in_f);
      for (std::size_t i = 0; i < targets_.size(); ++i) {
        if (projections_[i] != proj) continue;
        float* da = grads + lora_offsets_[i];
        adapter(own, i, ws).backward(dev, in, lora_u(s, i, n).input(), g, da, da + a_count(i),
                                     dx, lora_scratch(d), n);
      }
    };
    project(kFcProj, w.fc_proj, s.gelu.input(),
            detail::as_input(dev, dout, d.dout16, elements(n, c)), d.h, 4 * c, c);
    // GELU's backward on the kept fc; under bf16 its output rounded into grad16 too, c_fc's
    // products' input (h is dead after it: tmp is h's back, Note [Backward scratch lifetimes]).
    if (bf16)
      dev.activation_backward(Activation::gelu, s.fc.bf16, d.h, d.h, d.grad16,
                              elements(n, 4 * c));
    else
      dev.activation_backward(Activation::gelu, s.fc.f32, d.h, d.h, elements(n, 4 * c));
    const MatIn dh = bf16 ? MatIn{nullptr, d.grad16} : MatIn{d.h, nullptr};
    project(kFc, w.fc, s.ln2.input(), dh, d.tmp, c, 4 * c);
    // d res1 into din, or without one into h's front, as backward() (Note [Backward scratch
    // lifetimes]), under bf16 rounded into grad16 in the same pass.
    float* dres1 = din ? din : d.res1;
    dev.residual_layernorm_backward(s.res1, p.ln2_w, s.mean2, s.rstd2, d.tmp, dout, dres1,
                                    bf16 ? d.grad16 : nullptr, d.sink, d.sink + c, n, c);
    const MatIn dres1_g = bf16 ? MatIn{nullptr, d.grad16} : MatIn{dres1, nullptr};
    project(kAttnProj, w.attn_proj, s.atty.input(), dres1_g, d.tmp, c, c);
    // Under bf16 attention reads d atty rounded in datty16, as backward() writes it there (Note
    // [Backward scratch lifetimes]: dout16 may be din's storage, which holds d res1 by now).
    if (bf16) dev.to_bf16(d.tmp, d.datty16, elements(n, c));
    attention_backward(dev, s, d, batch, ws.positions);
    project(kCAttn, w.attn, s.ln1.input(),
            detail::as_input(dev, d.qkv, bf16 ? d.grad16 : nullptr, elements(n, 3 * c)), d.tmp,
            c, 3 * c);
    dev.residual_layernorm_backward(x, p.ln1_w, s.mean1, s.rstd1, d.tmp, din, din ? din : d.res1,
                                    nullptr, d.sink, d.sink + c, n, c);
  }

  // forward for the newest positions of one sequence (Note [KV cache]): c_attn writes their qkv
  // rows into the cache, which attention reads in full.
  bool decodes() const noexcept override { return true; }
  std::size_t cache_size() const noexcept override { return elements(t_, 3 * c_); }
  std::size_t decode_scratch_size(int count) const noexcept override {
    return Decode::at(nullptr, *this, count).size;
  }
  void decode(Device& dev, const float* params, const float* x, float* out,
              const DecodeStep& step) const override {
    const Params p = at(const_cast<float*>(params));
    const Linears w = linears(params, LayerWorkspace{});
    const Decode d = Decode::at(step.scratch, *this, step.count);
    const int n = step.count, c = c_;
    float* qkv = step.cache + elements(step.start, 3 * c);
    dev.layernorm_forward(x, p.ln1_w, p.ln1_b, d.ln, d.mean, d.rstd, n, c);
    detail::linear_forward(dev, w.attn, {d.ln, nullptr}, {qkv, nullptr}, nullptr, n, c, 3 * c);
    detail::cached_attention(dev, shape(1), step.cache, step.start, n, d.scores, d.atty);
    detail::linear_forward(dev, w.attn_proj, {d.atty, nullptr}, {d.res1, nullptr}, nullptr, n, c,
                           c);
    dev.residual_layernorm_forward(d.res1, x, d.res1, p.ln2_w, p.ln2_b, d.ln, d.mean, d.rstd, n,
                                   c);
    dev.linear_forward({.rows = n, .in = c, .out = 4 * c, .x = {d.ln, nullptr},
                        .weight = w.fc.weight, .bias = {w.fc.bias, nullptr},
                        .act = FusedActivation::gelu, .pre = {d.fc, nullptr},
                        .y = {d.gelu, nullptr}});
    detail::linear_forward(dev, w.fc_proj, {d.gelu, nullptr}, {out, nullptr}, nullptr, n, 4 * c,
                           c);
    dev.add(out, d.res1, out, elements(n, c));
  }

 private:
  // Pointers to the tensors of a parameter (or gradient) block.
  struct Params {
    float *ln1_w, *ln1_b, *attn_w, *attn_b, *attn_proj_w, *attn_proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fc_proj_w, *fc_proj_b;
  };
  Params at(float* base) const {
    const auto o = [&](BlockParam i) { return base + offsets_[i]; };
    return {o(kLn1W), o(kLn1B), o(kAttnW), o(kAttnB), o(kAttnProjW), o(kAttnProjB),
            o(kLn2W), o(kLn2B), o(kFcW),   o(kFcB),   o(kFcProjW),   o(kFcProjB)};
  }

  // The four linear maps as their matrix products read them (Note [bf16 compute]).
  struct Linears {
    detail::LinearParams attn, attn_proj, fc, fc_proj;
  };
  Linears linears(const float* params, const LayerWorkspace& ws) const {
    const auto linear = [&](BlockParam weight, BlockParam bias) {
      return detail::linear_params(params, ws, offsets_[weight], offsets_[bias]);
    };
    return {linear(kAttnW, kAttnB), linear(kAttnProjW, kAttnProjB), linear(kFcW, kFcB),
            linear(kFcProjW, kFcProjB)};
  }

  AttentionShape shape(int batch) const { return {batch, t_, h_, c_ / h_}; }
  AttentionShape packed_shape(int batch, const std::int32_t* positions) const {
    return {batch, t_, h_, c_ / h_, 0, positions};
  }

  // What forward keeps for backward, rows N = B * T. Under bf16 the tensors that are only
  // matrix-product inputs (and fc, GELU's input) are kept in bf16; res1 and the LayerNorm
  // statistics stay fp32. ln1, ln2, gelu and res1, what recompute() rewrites, come last, or from
  // `recomputed` when that is set (LayerWorkspace::recomputed); `recomputed` counts their floats.
  struct Saved {
    float *mean1, *rstd1;        // (N), (N)
    Kept qkv;                    // (N, 3C): q, k, v, each (N, C) with heads side by side
    Kept att;                    // materialised: (B, H, T, T) attention probabilities
    float* lse;                  // fused: (B, H, T) log-sum-exp of each row's scores
    Kept atty;                   // (N, C) attention output, heads side by side
    float* res1;                 // (N, C) first residual
    float *mean2, *rstd2;        // (N), (N)
    Kept fc;                     // (N, 4C)
    Kept ln1, ln2;               // (N, C) each
    Kept gelu;                   // (N, 4C)
    Kept lora_u;                 // LoRA: (targets, N, rank), each target's s x A^T
    std::size_t size, recomputed;
    static Saved at(float* base, float* recomputed, AttentionShape a, bool fused, bool bf16,
                    std::size_t lora_u) {
      const std::size_t n = std::size_t(a.batch) * a.T, c = std::size_t(a.heads) * a.head_size;
      const std::size_t rows = std::size_t(a.batch) * a.heads * a.T;  // (B, H, T)
      Carver k(base);
      const auto kept = [&](Carver& in, std::size_t count) { return Kept::take(in, count, bf16); };
      Saved s{k.take(n), k.take(n), kept(k, 3 * n * c), kept(k, fused ? 0 : rows * a.T),
              k.take(fused ? rows : 0), kept(k, n * c), nullptr, k.take(n), k.take(n),
              kept(k, 4 * n * c), {}, {}, {}, kept(k, lora_u), 0, 0};
      // ln1, ln2, gelu and res1 after the rest, or in `recomputed`; counted as a buffer of their
      // own.
      Carver apart(recomputed), measure(nullptr);
      Carver& r = recomputed ? apart : k;
      s.ln1 = kept(r, n * c);
      s.ln2 = kept(r, n * c);
      s.gelu = kept(r, 4 * n * c);
      s.res1 = r.take(n * c);
      for (std::size_t count : {n * c, n * c, 4 * n * c}) (void)kept(measure, count);
      (void)measure.take(n * c);
      s.size = k.used();
      s.recomputed = measure.used();
      return s;
    }
  };

  // Backward's temporaries; forward's too under bf16 (matrix products' fp32 outputs before
  // rounding). Those whose lifetimes are disjoint share storage (Note [Backward scratch
  // lifetimes]): qkv and res1 lie at the front of h, and under bf16 tmp at its back.
  //
  // Note [Backward scratch lifetimes]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // backward() runs, in order (fp32 | bf16; "reads" are what a call reads, "writes" what it
  // leaves):
  //   1 dout16 = bf16(dout)                              (bf16)
  //   2 c_proj (MLP): reads dout(16), writes h, grad16   (h fp32: working memory under bf16)
  //   3 c_fc: reads h | grad16, writes tmp
  //   4 ln_2: reads tmp, dout, writes d res1, grad16
  //   5 c_proj (attn): reads d res1, grad16, writes tmp (bf16: working memory), datty16
  //   6 attention: reads tmp | datty16 (materialised: att, grad16 as working memory), writes qkv
  //   7 c_attn: reads qkv (rounded into grad16), writes tmp
  //   8 ln_1: reads tmp, d res1, writes din
  // So h is dead after 3 (after 2 under bf16), qkv lives in 6-7 only: qkv takes the front
  // 3 (N, C) of h. Under bf16, c_fc (3) reads grad16, not h, so tmp (3-8) takes the back (N, C)
  // of h, beside qkv; in fp32 c_fc reads h while it writes tmp, which keeps its own region.
  // d res1 (4-8) is written into din itself (ln_1's backward adds to it in place, as
  // residual_layernorm_backward allows): din is one of the replica's two ping-pong activation
  // gradients, never dout (src/model/model.cpp's invariants), and backward overwrites it, so
  // nothing reads its old contents. Without a din (a block as a first layer), d res1 is
  // needed only in 4-5 (ln_1's parameter gradients do not read the residual): it takes the
  // front of h, dead by 4 and qkv's only from 6, and ln_1's discarded dx goes there in 8.
  // The bf16 roundings of dout (1-2) and of d atty (5-6), (N, C) each, need no region of
  // their own with a din and the fused path (issue 45: 12 of a GPT-2 124M block's 156 MiB of
  // scratch at B 8 x T 1024, bf16, the scratch's peak being step 2): dout16 lies in din's
  // storage (its first half: N C bf16 in N C floats), read by 2 only, before anything writes
  // din (4, d res1), and datty16 in grad16 from the first 64-byte line past d res1's rounding
  // (which 5 reads while it writes datty16; 7 writes over both after 6 has read datty16; the
  // fused attention's backward uses no scratch). The materialised path's attention uses grad16 as
  // working memory while it reads datty16, and a block without din has none to lend, so
  // either keeps a region of (N, C) bf16 for both, one after the other: that is why the
  // scratch a block needs depends on its place (Layer::scratch_size_with_din: Replica and the
  // memory plan size the scratch by it for every layer but the first).
  // Forward uses qkv, then (materialised bf16) tmp, then h, each as a product's fp32 output
  // rounded within its own call: one at a time. The devices run a block's calls in order on
  // one stream and keep nothing of a call's operands for later (the CUDA device's cuDNN and
  // cuBLASLt workspaces are its own), so the sharing holds there too. What would break it: a
  // call that reads h or qkv beyond the steps above (e.g. c_fc reading h under bf16), a
  // product that reads dout16 after 4 or writes din before it, an attention backward that
  // reads grad16 on the fused path, or a din that aliases dout or x. Tests: tests/model/test_backward_scratch.cpp (a block's
  // gradients with a din and without one, scratch and din filled with NaN first, bf16 against
  // fp32) and the finite differences of test_gpt.cpp.
  struct Scratch {
    float* h;     // (N, 4C) gradient of the MLP's hidden layer, before and after GELU
    float* tmp;   // (N, C) gradient at a LayerNorm's output or of the attention output
    float* res1;  // (N, C) gradient of the first residual, for a block without din: h's front
    float* qkv;   // (N, 3C) gradient of qkv: h's front
    float* att;   // materialised: (B, H, T, T) gradient of the probabilities, then of the scores
    // bf16 only (null otherwise), max((N, 4C), att): a gradient rounded to bf16 as a
    // matrix-product input.
    std::uint16_t* grad16;
    // bf16 only: (N, C) the block's output gradient rounded, read by c_proj's products while
    // they write the gradient of fc into grad16: in din's storage, or without a din (or with
    // the materialised path) in a region of its own.
    std::uint16_t* dout16;
    // bf16 only: (N, C) the gradient of atty rounded, attention's input: with the fused path
    // and a din, in grad16 past d res1's rounding (from a 64-byte line), else dout16's region,
    // free by then, while the materialised path's score gradients use grad16.
    std::uint16_t* datty16;
    float* lora_du;  // LoRA: (N, rank), an adapter's du
    float* sink;     // LoRA: (2C), the frozen LayerNorms' weight and bias gradients, discarded
    // LoRA with dropout: (N, 4C), an adapter's dropped input; in its backward, its input
    // gradient before the mask.
    float* lora_x;
    std::uint16_t* lora_du16;  // LoRA under bf16: (N, rank), du rounded
    std::uint16_t* lora_x16;   // LoRA with dropout under bf16: (N, 4C), lora_x rounded
    float* base32;             // LoRA under bf16: (13C), the widened base tensors (kWidened)
    std::size_t size;
    // fp32: (N, 4C) + (N, C) + att floats; bf16: (N, 4C) + att floats, then grad16 and (see
    // dout16) a region of (N, C) bf16; then LoRA's: rank (0: none), and whether its adapters
    // drop their input. with_din: for a backward that gets din (its storage when set).
    static Scratch at(float* base, AttentionShape a, bool fused, bool bf16, int rank, bool drops,
                      bool with_din, float* din) {
      const std::size_t n = std::size_t(a.batch) * a.T, c = std::size_t(a.heads) * a.head_size;
      const std::size_t att = fused ? 0 : std::size_t(a.batch) * a.heads * a.T * a.T;
      const std::size_t widest = std::max(4 * n * c, att);
      // d res1's rounding takes grad16's first (N, C), to a whole 64-byte line.
      const std::size_t past_dres1 = 2 * detail::bf16_floats(n * c);
      const bool in_din = bf16 && fused && with_din && past_dres1 + n * c <= widest;
      Carver k(base);
      float* h = k.take(4 * n * c);
      float* tmp = bf16 ? (h ? h + 3 * n * c : nullptr) : k.take(n * c);
      float* att_d = k.take(att);
      std::uint16_t* grad16 = bf16 ? k.take_bf16(widest) : nullptr;
      std::uint16_t* region = bf16 && !in_din ? k.take_bf16(n * c) : nullptr;
      std::uint16_t* datty16 = in_din && grad16 ? grad16 + past_dres1 : region;
      Scratch s{h, tmp, h, h, att_d, grad16,
                in_din ? reinterpret_cast<std::uint16_t*>(din) : region, datty16,
                k.take(n * std::size_t(rank)), k.take(rank > 0 ? 2 * c : 0),
                k.take(drops ? 4 * n * c : 0),
                bf16 && rank > 0 ? k.take_bf16(n * std::size_t(rank)) : nullptr,
                bf16 && drops ? k.take_bf16(4 * n * c) : nullptr,
                k.take(bf16 && rank > 0 ? widened_count(c) : 0), 0};
      s.size = k.used();
      return s;
    }
  };

  // res1 = x + c_proj(atty) with c_proj's adapters, and ln_2 of it, in one pass (Note [Residual
  // LayerNorm]): forward's calls, which recompute() makes again on the kept atty and x.
  void residual1(Device& dev, const float* own, const LayerWorkspace& ws, const Params& p,
                 const Linears& w, const Saved& s, const Scratch& d, const float* x,
                 int n) const {
    detail::linear_forward(dev, w.attn_proj, s.atty.input(), {s.res1, nullptr}, nullptr, n, c_,
                           c_);
    adapt_forward(dev, own, ws, s, d, kAttnProj, s.atty.input(), s.res1, n);
    s.ln2.store([&](auto* y) {
      dev.residual_layernorm_forward(s.res1, x, s.res1, p.ln2_w, p.ln2_b, y, s.mean2, s.rstd2, n,
                                     c_);
    });
  }

  Saved saved(const LayerWorkspace& ws, int batch) const {
    const std::size_t lora_u = targets_.size() * std::size_t(batch) * t_ * rank_;
    return Saved::at(ws.saved, ws.recomputed, shape(batch), fused_,
                     ws.precision == Precision::bf16, lora_u);
  }
  // with_din: backward with this din (forward: none needed, the smaller layout).
  Scratch scratch(const LayerWorkspace& ws, int batch, bool with_din = true,
                  float* din = nullptr) const {
    return Scratch::at(ws.scratch, shape(batch), fused_, ws.precision == Precision::bf16, rank_,
                       lora_dropout_ > 0.0f, with_din, din);
  }

  // ---- LoRA (Note [LoRA] in lora.cpp) ----
  // The four projections, in the order of gpt2_lora_target_names().
  enum Projection { kCAttn, kAttnProj, kFc, kFcProj };
  bool lora() const noexcept { return rank_ > 0; }
  bool has_target(Projection p) const {
    return std::find(projections_.begin(), projections_.end(), p) != projections_.end();
  }
  // The base tensors as a call reads them: the fp32 values (the LayerNorms' weights and biases,
  // the biases) and the four linear maps.
  struct Base {
    Params p;
    Linears w;
  };
  // What base_of widens under bf16 with LoRA, in this order in Scratch::base32: the LayerNorms'
  // weights and biases and the biases, 13C values.
  static constexpr std::pair<BlockParam, int> kWidened[] = {
      {kLn1W, 1}, {kLn1B, 1}, {kAttnB, 3}, {kAttnProjB, 1},
      {kLn2W, 1}, {kLn2B, 1}, {kFcB, 4},   {kFcProjB, 1}};
  static std::size_t widened_count(std::size_t c) {
    std::size_t count = 0;
    for (const auto& [i, width] : kWidened) count += std::size_t(width) * c;
    return count;
  }
  // The block's own parameters (and their bf16 copy under bf16), or with LoRA the frozen base's,
  // which under bf16 are bf16 bits only (Note [Frozen parameters] in lora.cpp): the products
  // read them as they are, and what is read in fp32 (kWidened) is widened into d.base32 each
  // call; the weights' fp32 pointers are then null, never read.
  Base base_of(Device& dev, const float* own, const LayerWorkspace& ws, const Scratch& d) const {
    if (!lora()) return {at(const_cast<float*>(own)), linears(own, ws)};
    if (ws.precision != Precision::bf16) {
      if (!ws.frozen) throw std::logic_error("gpt block: LoRA needs the frozen base weights");
      return {at(const_cast<float*>(ws.frozen)), linears(ws.frozen, ws)};
    }
    const std::uint16_t* bits = ws.frozen_bf16;
    if (!bits) throw std::logic_error("gpt block: LoRA needs the frozen base weights");
    float* widened[kBlockParams] = {};
    Carver k(d.base32);
    for (const auto& [i, width] : kWidened) {
      const std::size_t count = std::size_t(width) * std::size_t(c_);
      widened[i] = k.take(count);
      dev.from_bf16(bits + offsets_[i], widened[i], count);
    }
    const auto linear = [&](BlockParam weight, BlockParam bias) {
      return detail::LinearParams{{nullptr, bits + offsets_[weight]}, widened[bias],
                                  bits + offsets_[bias]};
    };
    const Params p{widened[kLn1W], widened[kLn1B], nullptr, widened[kAttnB], nullptr,
                   widened[kAttnProjB], widened[kLn2W], widened[kLn2B], nullptr, widened[kFcB],
                   nullptr, widened[kFcProjB]};
    return {p, {linear(kAttnW, kAttnB), linear(kAttnProjW, kAttnProjB), linear(kFcW, kFcB),
                linear(kFcProjW, kFcProjB)}};
  }
  // The targets in storage order, each with its projection's shape and output columns.
  void add_targets(const LoraSpec& lora) {
    const std::vector<std::string>& names = detail::gpt2_lora_target_names();
    const int c = c_;
    const LoraTarget known[] = {{names[0], ".attn.c_attn", c, 3 * c, 0, 3 * c},
                                {names[1], ".attn.c_proj", c, c, 0, c},
                                {names[2], ".mlp.c_fc", c, 4 * c, 0, 4 * c},
                                {names[3], ".mlp.c_proj", 4 * c, c, 0, c}};
    for (const std::string& name : lora.targets)
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw std::invalid_argument(fmt::format(
            "gpt block: LoRA target '{}' is none of {}", name, fmt::join(names, ", ")));
    for (int i = 0; i < 4; ++i) {
      if (std::find(lora.targets.begin(), lora.targets.end(), names[i]) == lora.targets.end())
        continue;
      targets_.push_back(known[i]);
      projections_.push_back(static_cast<Projection>(i));
      lora_offsets_.push_back(lora_count_);
      lora_count_ += std::size_t(rank_) * (known[i].in + known[i].out);
    }
    if (targets_.empty()) throw std::invalid_argument("gpt block: LoRA needs at least one target");
  }
  std::size_t a_count(std::size_t i) const { return std::size_t(rank_) * targets_[i].in; }
  // Target i's adapter in this forward: its mask's key from the layer's (Note [LoRA dropout]).
  // Under bf16 its products read A's and B's bf16 copies.
  LoraAdapter adapter(const float* own, std::size_t i, const LayerWorkspace& ws) const {
    const float* a = own + lora_offsets_[i];
    const std::uint16_t* a16 =
        ws.precision == Precision::bf16 ? ws.params_bf16 + lora_offsets_[i] : nullptr;
    return {a, a + a_count(i), rank_, lora_scale_, targets_[i], lora_dropout_,
            ws.dropout_key != 0 ? detail::derive_key(ws.dropout_key, i) : 0, a16,
            a16 ? a16 + a_count(i) : nullptr};
  }
  // Target i's u (N, rank) in Saved::lora_u.
  Kept lora_u(const Saved& s, std::size_t i, int rows) const {
    const std::size_t at = i * std::size_t(rows) * rank_;
    return s.lora_u.bf16 ? Kept{nullptr, s.lora_u.bf16 + at} : Kept{s.lora_u.f32 + at, nullptr};
  }
  static detail::LoraScratch lora_scratch(const Scratch& d) {
    return {d.lora_x, d.lora_x16, d.lora_du, d.lora_du16};
  }

  // The adapters on projection `proj` add into its fp32 output y (Note [LoRA] in lora.cpp).
  void adapt_forward(Device& dev, const float* own, const LayerWorkspace& ws, const Saved& s,
                     const Scratch& d, Projection proj, MatIn in, float* y, int n) const {
    for (std::size_t i = 0; i < targets_.size(); ++i)
      if (projections_[i] == proj)
        adapter(own, i, ws).forward(dev, in, y, lora_u(s, i, n).output(), lora_scratch(d), n);
  }
  // A linear map of forward and the projection its adapters add into.
  struct ProductCall {
    Projection proj;
    const detail::LinearParams& map;
    int in, out;
  };
  // y (N, out) = in W^T + b in y's storage, then the adapters on call.proj add theirs. With
  // adapters and a bf16 y (qkv, fc), the base's product and theirs are summed in the fp32
  // `product` (N, out) and rounded into y once, as the Llama block does.
  void project_forward(Device& dev, const float* own, const LayerWorkspace& ws, const Saved& s,
                       const Scratch& d, const ProductCall& call, MatIn in, MatOut y,
                       float* product, int n) const {
    const bool sum_first = has_target(call.proj) && y.bf16;
    detail::linear_forward(dev, call.map, in, sum_first ? MatOut{product, nullptr} : y,
                           sum_first ? nullptr : product, n, call.in, call.out);
    adapt_forward(dev, own, ws, s, d, call.proj, in, sum_first ? product : y.f32, n);
    if (sum_first) dev.to_bf16(product, y.bf16, elements(n, call.out));
  }

  // decode()'s scratch for n positions.
  struct Decode {
    float *ln, *mean, *rstd;  // (n, C), (n), (n)
    float* scores;            // (H, n, up to T)
    float *atty, *res1;       // (n, C) each
    float *fc, *gelu;         // (n, 4C) each
    std::size_t size;
    static Decode at(float* base, const Block& b, int count) {
      const std::size_t n = std::size_t(count), c = std::size_t(b.c_);
      Carver k(base);
      Decode d{k.take(n * c), k.take(n), k.take(n), k.take(std::size_t(b.h_) * n * b.t_),
               k.take(n * c), k.take(n * c), k.take(4 * n * c), k.take(4 * n * c), 0};
      d.size = k.used();
      return d;
    }
  };

  static std::size_t elements(int rows, int cols) { return std::size_t(rows) * std::size_t(cols); }

  // The attention's buffers in the block's workspace (model/attention.hpp): the fused path's
  // log-sum-exp, or the materialised path's probabilities (kept) and working memory.
  detail::AttentionBuffers attention_buffers(const Saved& s, const Scratch& d) const {
    if (fused_) return {.path = AttentionKind::fused, .lse = s.lse};
    return {.path = AttentionKind::materialized, .probs = s.att.output(), .squares = d.att,
            .squares16 = d.grad16, .y_product = d.tmp};
  }

  // atty = attention(q, k, v) from s.qkv.
  // Packed windows: positions (B, T), each row's in its own sequence (Note [Packed attention]).
  void attention_forward(Device& dev, const Saved& s, const Scratch& d, int batch,
                         const std::int32_t* positions) const {
    detail::attention_forward(dev, packed_shape(batch, positions), s.qkv.input(),
                              s.atty.output(), attention_buffers(s, d));
  }

  // From d atty (g.tmp, or under bf16 its rounding in g.datty16), writes g.qkv.
  void attention_backward(Device& dev, const Saved& s, const Scratch& g, int batch,
                          const std::int32_t* positions) const {
    const MatIn dy = g.datty16 ? MatIn{nullptr, g.datty16} : MatIn{g.tmp, nullptr};
    detail::attention_backward(dev, packed_shape(batch, positions), s.qkv.input(),
                               s.atty.input(), dy, attention_buffers(s, g), g.qkv);
  }

  int t_, c_, h_, n_layer_;
  bool fused_;
  std::size_t offsets_[kBlockParams] = {};
  std::size_t count_ = 0;
  // LoRA (rank_ 0: none): the targets, the projection each adds into, and where each one's A
  // then B lie in the block's parameters.
  int rank_ = 0;
  float lora_scale_ = 0.0f;
  float lora_dropout_ = 0.0f;
  std::vector<LoraTarget> targets_;
  std::vector<Projection> projections_;
  std::vector<std::size_t> lora_offsets_;
  std::size_t lora_count_ = 0;
};

// ---- Final LayerNorm --------------------------------------------------------------------------

// Parameters: weight (C), bias (C). in, out (B, T * C), normalised per position.
class LayerNorm final : public Layer {
 public:
  LayerNorm(int context, int channels) : t_(context), c_(channels) {}

  std::string_view kind() const noexcept override { return "layernorm"; }
  int in_features() const noexcept override { return t_ * c_; }
  int out_features() const noexcept override { return t_ * c_; }
  std::size_t param_count() const noexcept override { return 2 * std::size_t(c_); }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    return {{prefix + ".weight", 0, {c_}}, {prefix + ".bias", std::size_t(c_), {c_}}};
  }
  void init_parameters(float* params, std::uint64_t& /*rng*/) const override {
    std::fill(params, params + c_, 1.0f);
    std::fill(params + c_, params + 2 * c_, 0.0f);
  }
  // mean, rstd (N) each.
  std::size_t workspace_size(int batch, Precision /*precision*/) const noexcept override {
    return 2 * std::size_t(batch) * t_;
  }
  // (2C): the weight's and bias's gradients when they are frozen (grads null), discarded;
  // bf16, (2C) more: a frozen weight and bias widened from their bf16 bits.
  std::size_t scratch_size(int /*batch*/, Precision precision) const noexcept override {
    return std::size_t(c_) * (precision == Precision::bf16 ? 4 : 2);
  }
  // Backward reads the input and the statistics (Note [Head input] in src/model/model.cpp).
  bool backward_reads_output() const noexcept override { return false; }

  void forward(Device& dev, const float* params, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    const std::size_t n = std::size_t(batch) * t_;
    params = weights(dev, params, ws);
    dev.layernorm_forward(in, params, params + c_, out, ws.saved, ws.saved + n,
                          static_cast<int>(n), c_);
  }
  void backward(Device& dev, const float* params, float* grads, const float* in,
                const float* /*out*/, const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    const std::size_t n = std::size_t(batch) * t_;
    // A GPT's final LayerNorm always has a din, which it writes (no residual: a null one).
    if (!din) throw std::logic_error("layernorm: needs an input gradient (not a first layer)");
    float* g = grads ? grads : ws.scratch;
    params = weights(dev, params, ws);
    dev.residual_layernorm_backward(in, params, ws.saved, ws.saved + n, dout, nullptr, din,
                                    nullptr, g, g + c_, static_cast<int>(n), c_);
  }
  // Note [KV cache]: mean and rstd (count) each in the scratch.
  bool decodes() const noexcept override { return true; }
  std::size_t decode_scratch_size(int count) const noexcept override {
    return 2 * std::size_t(count);
  }
  void decode(Device& dev, const float* params, const float* in, float* out,
              const DecodeStep& step) const override {
    dev.layernorm_forward(in, params, params + c_, out, step.scratch, step.scratch + step.count,
                          step.count, c_);
  }

 private:
  // The fp32 weight then bias: params, or with params null (frozen, held in bf16 only: Note
  // [Frozen parameters] in lora.cpp) their bf16 bits widened into the scratch after the sink.
  const float* weights(Device& dev, const float* params, const LayerWorkspace& ws) const {
    if (params) return params;
    if (!ws.params_bf16) throw std::logic_error("layernorm: no weights, fp32 or bf16");
    float* widened = ws.scratch + 2 * c_;
    dev.from_bf16(ws.params_bf16, widened, 2 * std::size_t(c_));
    return widened;
  }
  int t_, c_;
};

}  // namespace

std::unique_ptr<Layer> make_embedding(int vocab, int context, int channels) {
  return std::make_unique<Embedding>(vocab, context, channels);
}
std::unique_ptr<Layer> make_block(int context, int channels, int heads, int n_layer,
                                  AttentionKind attention) {
  return std::make_unique<Block>(context, channels, heads, n_layer, attention);
}
namespace detail {
std::unique_ptr<Layer> make_gpt_block(int context, int channels, int heads, int n_layer,
                                      AttentionKind attention, const LoraSpec& lora) {
  if (lora.rank < 0)
    throw std::invalid_argument(fmt::format("gpt block: LoRA rank {} is negative", lora.rank));
  return std::make_unique<Block>(context, channels, heads, n_layer, attention, lora);
}
}  // namespace detail
std::unique_ptr<Layer> make_layernorm(int context, int channels) {
  return std::make_unique<LayerNorm>(context, channels);
}

}  // namespace lockstep
