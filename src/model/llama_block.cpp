// A Llama-family decoder block (Llama, Qwen2, Mistral, SmolLM2; Note [One decoder] in
// decoder.cpp), as a layer over flattened sequences:
//   h = rmsnorm(x); qkv = h Wqkv^T (+ bqkv); q, k rotated (RoPE); a = attention(q, k, v);
//   res1 = x + a Wo^T (+ bo); h2 = rmsnorm(res1); gu = h2 Wgu^T (+ bgu);
//   out = res1 + swiglu(gu) Wdown^T (+ bdown).
//
// Notation: B sequences of T positions, C = d_model channels, H query heads and Hkv key/value
// heads of D channels, Q = H D, KV = Hkv D, W = Q + 2 KV (the qkv row), F = intermediate_size,
// N = B T rows. A sample is (T * C) floats. Every matrix is row-major, weights (out, in) as
// torch.nn.Linear.
//
// With LoRA adapters (Note [LoRA] in lora.cpp) the block's parameters are the adapters of its
// targeted projections and the tensors above are its frozen parameters; the adapters add into
// the products' outputs and their input gradients.
//
// Invariants (as every layer): stateless; backward accumulates into parameter gradients (+=) and
// overwrites din (=). What backward needs from forward is in LayerWorkspace::saved (Saved);
// temporaries in the shared LayerWorkspace::scratch (Scratch). bf16 keeps the tensors that are
// only matrix-product inputs in bf16, as GPT-2's block does (Note [bf16 compute]).
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/model.hpp"
#include "common/random.hpp"
#include "model/attention.hpp"
#include "model/lora.hpp"
#include "model/ops.hpp"
#include "model/rope.hpp"

namespace lockstep {
namespace {

using detail::Carver;
using detail::Kept;
using detail::LoraAdapter;
using detail::LoraTarget;

// The block's tensors in storage order, Hugging Face's names: q, k and v contiguous (one (W, C)
// product) and gate, up contiguous (one (2F, C) product). The biases exist as the spec says.
enum LlamaParam {
  kInNorm, kQkvW, kQkvB, kOW, kOB, kPostNorm, kGateUpW, kGateUpB, kDownW, kDownB, kLlamaParams
};

struct Widths {
  std::int64_t c, q, kv, f;
  bool qkv_bias, proj_bias;
};

std::vector<ParamTensor> llama_block_tensors(const std::string& p, const Widths& w,
                                             std::size_t (&offsets)[kLlamaParams]) {
  std::vector<ParamTensor> out;
  std::size_t offset = 0;
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    out.push_back({p + name, offset, std::move(shape)});
    offset += out.back().numel();
  };
  const auto mark = [&](LlamaParam i) { offsets[i] = offset; };
  mark(kInNorm);
  add(".input_layernorm.weight", {w.c});
  mark(kQkvW);
  add(".self_attn.q_proj.weight", {w.q, w.c});
  add(".self_attn.k_proj.weight", {w.kv, w.c});
  add(".self_attn.v_proj.weight", {w.kv, w.c});
  mark(kQkvB);
  if (w.qkv_bias) {
    add(".self_attn.q_proj.bias", {w.q});
    add(".self_attn.k_proj.bias", {w.kv});
    add(".self_attn.v_proj.bias", {w.kv});
  }
  mark(kOW);
  add(".self_attn.o_proj.weight", {w.c, w.q});
  mark(kOB);
  if (w.proj_bias) add(".self_attn.o_proj.bias", {w.c});
  mark(kPostNorm);
  add(".post_attention_layernorm.weight", {w.c});
  mark(kGateUpW);
  add(".mlp.gate_proj.weight", {w.f, w.c});
  add(".mlp.up_proj.weight", {w.f, w.c});
  mark(kGateUpB);
  if (w.proj_bias) {
    add(".mlp.gate_proj.bias", {w.f});
    add(".mlp.up_proj.bias", {w.f});
  }
  mark(kDownW);
  add(".mlp.down_proj.weight", {w.c, w.f});
  mark(kDownB);
  if (w.proj_bias) add(".mlp.down_proj.bias", {w.c});
  return out;
}

// A linear map whose bias may be absent (a Llama's projections have none): with a bias the
// Device's fused linear op (Note [Fused linear]); without, the product alone, into y or (bf16 y)
// into `product` and rounded into y.
struct Projection {
  MatIn weight;
  const float* bias = nullptr;           // fp32 master, or null
  const std::uint16_t* bias_bf16 = nullptr;
  int in = 0, out = 0;

  void forward(Device& dev, MatIn x, MatOut y, float* product, int rows) const {
    if (bias) {
      dev.linear_forward({.rows = rows, .in = in, .out = out, .x = x, .weight = weight,
                          .bias = y.bf16 ? MatIn{nullptr, bias_bf16} : MatIn{bias, nullptr},
                          .y = y, .product = product});
      return;
    }
    float* c = y.bf16 ? product : y.f32;
    detail::matmul(dev, Transpose::no, Transpose::yes, rows, out, in, x, in, weight, in, 0.0f, c,
                   out);
    if (y.bf16) dev.to_bf16(c, y.bf16, std::size_t(rows) * std::size_t(out));
  }
  // dweight += g^T x; dbias += column sums of dy (when the map has a bias); dx = g weight (when
  // dx is set), rounded into dx_bf16 when that is set (bf16 weights).
  void backward(Device& dev, MatIn x, const float* dy, MatIn g, float* dweight, float* dbias,
                float* dx, std::uint16_t* dx_bf16, int rows) const {
    dev.linear_backward({.rows = rows, .in = in, .out = out, .x = x, .weight = weight, .dy = dy,
                         .g = g, .dweight = dweight, .dbias = bias ? dbias : nullptr, .dx = dx,
                         .dx_bf16 = dx_bf16});
  }
};

// The block's four products, which LoRA targets add into.
enum Product { kQkvProduct, kOProduct, kGateUpProduct, kDownProduct };

class LlamaBlock final : public Layer {
 public:
  LlamaBlock(const GptSpec& spec, AttentionKind attention, RopeConstants rope,
             const LoraSpec& lora)
      : t_(spec.context), c_(spec.d_model), h_(spec.n_head), hkv_(spec.kv_heads()),
        d_(spec.head_size()), f_(spec.hidden_size()), eps_(static_cast<float>(spec.norm_eps)),
        qkv_bias_(spec.qkv_bias), proj_bias_(spec.proj_bias),
        fused_(attention == AttentionKind::fused), rope_(std::move(rope)),
        rank_(lora.enabled() ? lora.rank : 0), lora_scale_(lora.enabled() ? lora.scale() : 0.0f),
        lora_dropout_(lora.enabled() ? static_cast<float>(lora.dropout) : 0.0f) {
    if (attention == AttentionKind::automatic)
      throw std::invalid_argument(
          "llama block: attention 'auto' must be resolved first (choose_attention)");
    if (!rope_.table || rope_.positions < t_ || rope_.half != d_ / 2)
      throw std::invalid_argument("llama block: the RoPE table does not fit its shape");
    const std::vector<ParamTensor> tensors = llama_block_tensors("", widths(), offsets_);
    count_ = tensors.back().offset + tensors.back().numel();
    if (lora.enabled()) add_targets(lora);
  }

  std::string_view kind() const noexcept override { return "llama_block"; }
  int in_features() const noexcept override { return t_ * c_; }
  int out_features() const noexcept override { return t_ * c_; }
  std::size_t param_count() const noexcept override { return lora() ? lora_count_ : count_; }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    if (lora()) return detail::lora_tensors(prefix, lora_targets(), rank_);
    return base_tensors(prefix);
  }
  std::size_t frozen_count() const noexcept override { return lora() ? count_ : 0; }
  std::vector<ParamTensor> frozen_tensors(const std::string& prefix) const override {
    if (!lora()) return {};
    return base_tensors(prefix);
  }
  std::shared_ptr<const std::vector<float>> constants() const override { return rope_.table; }

  // RMSNorm weights 1, linear weights N(0, 0.02) (transformers' initializer_range), biases 0;
  // draws in storage order. With LoRA these are the frozen base's, and the parameters are the
  // adapters (detail::init_lora).
  void init_parameters(float* params, std::uint64_t& rng) const override {
    if (lora())
      detail::init_lora(params, lora_targets(), rank_, rng);
    else
      init_base(params, rng);
  }
  void init_frozen(float* frozen, std::uint64_t& rng) const override {
    if (lora()) init_base(frozen, rng);
  }
  void init_base(float* params, std::uint64_t& rng) const {
    std::fill(params, params + count_, 0.0f);
    for (const ParamTensor& t : base_tensors("")) {
      float* p = params + t.offset;
      if (t.name.ends_with("layernorm.weight"))
        std::fill(p, p + t.numel(), 1.0f);
      else if (t.name.ends_with(".weight"))
        detail::fill_normal(p, t.numel(), detail::kInitStd, rng);
    }
  }

  std::size_t workspace_size(int batch, Precision precision) const noexcept override {
    return Saved::at(nullptr, nullptr, *this, batch, precision == Precision::bf16).size;
  }
  std::size_t scratch_size(int batch, Precision precision) const noexcept override {
    return Scratch::at(nullptr, *this, batch, precision == Precision::bf16, false).size;
  }
  // With a din, bf16 and fused attention: without a region for the rounded gradients (Note
  // [Backward scratch lifetimes] in gpt.cpp).
  std::size_t scratch_size_with_din(int batch, Precision precision) const noexcept override {
    return Scratch::at(nullptr, *this, batch, precision == Precision::bf16, true).size;
  }
  // The two RMSNorms' outputs, SwiGLU's and res1 (Note [Recomputation] in src/model/model.cpp).
  std::size_t recomputed_size(int batch, Precision precision) const noexcept override {
    return Saved::at(nullptr, nullptr, *this, batch, precision == Precision::bf16).recomputed;
  }
  // The calls forward made, on what it kept: the input norm of x, res1 and the post-attention
  // norm of it (residual1: o_proj's product of the kept atty with its adapters, the residual
  // add and the norm), with their rstd rewritten with their own bits, and SwiGLU of gate | up.
  void recompute(Device& dev, const float* own, const float* x, int batch,
                 const LayerWorkspace& ws) const override {
    const bool bf16 = ws.precision == Precision::bf16;
    const Saved s = Saved::at(ws.saved, ws.recomputed, *this, batch, bf16);
    const Scratch d = Scratch::at(ws.scratch, *this, batch, bf16, true);
    const Base base = base_of(dev, own, ws, d);
    const int n = batch * t_;
    s.ln1.store([&](auto* y) {
      dev.residual_rmsnorm_forward(x, nullptr, nullptr, base.in_norm, y, s.rstd1, n, c_, eps_);
    });
    residual1(dev, own, ws, s, d, base, x, n);
    swiglu(dev, s, n);
  }

  void forward(Device& dev, const float* own, const float* x, float* out, int batch,
               const LayerWorkspace& ws) const override {
    const bool bf16 = ws.precision == Precision::bf16;
    const Saved s = Saved::at(ws.saved, ws.recomputed, *this, batch, bf16);
    const Scratch d = Scratch::at(ws.scratch, *this, batch, bf16, true);
    const Base base = base_of(dev, own, ws, d);
    const Maps& m = base.maps;
    const int n = batch * t_;
    const auto project = [&](Product p, const Projection& map, const Kept& in, MatOut y,
                             float* product) {
      project_forward(dev, own, ws, s, d, {p, map, in, y, product}, n);
    };
    s.ln1.store([&](auto* y) {
      dev.residual_rmsnorm_forward(x, nullptr, nullptr, base.in_norm, y, s.rstd1, n, c_, eps_);
    });
    project(kQkvProduct, m.qkv, s.ln1, s.qkv.output(), d.qkv);
    s.qkv.store([&](auto* qkv) { dev.rope_forward(rope_shape(batch, ws), rope_table(ws), qkv); });
    detail::attention_forward(dev, attention_shape(batch, ws), s.qkv.input(), s.atty.output(),
                              attention_buffers(s, d));
    residual1(dev, own, ws, s, d, base, x, n);
    project(kGateUpProduct, m.gate_up, s.ln2, s.gu.output(), d.dgu);
    swiglu(dev, s, n);
    project(kDownProduct, m.down, s.act, {out, nullptr}, nullptr);
    dev.add(out, s.res1, out, elements(n, c_));
  }

  void backward(Device& dev, const float* own, float* grads, const float* x,
                const float* /*out*/, const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    const bool bf16 = ws.precision == Precision::bf16;
    const Saved s = Saved::at(ws.saved, ws.recomputed, *this, batch, bf16);
    const Scratch d = Scratch::at(ws.scratch, *this, batch, bf16, din != nullptr, din);
    const Base base = base_of(dev, own, ws, d);
    const Maps& m = base.maps;
    const int n = batch * t_;
    // The base's gradients; with LoRA it has none (the norms' weights' go to a discarded sink).
    const auto g = [&](LlamaParam i) { return lora() ? nullptr : grads + offsets_[i]; };
    const auto norm_g = [&](LlamaParam i) { return lora() ? d.sink : g(i); };
    // A product's backward: the base's (input gradient alone with LoRA), then its adapters',
    // then (dx16 set) dx rounded.
    const auto project = [&](Product p, const Projection& map, MatIn in, const float* dy,
                             MatIn dy_g, LlamaParam w, LlamaParam b, float* dx,
                             std::uint16_t* dx16) {
      if (!lora()) return map.backward(dev, in, dy, dy_g, g(w), g(b), dx, dx16, n);
      detail::matmul(dev, Transpose::no, Transpose::no, n, map.in, map.out, dy_g, map.out,
                     map.weight, map.in, 0.0f, dx, map.in);
      for (std::size_t i = 0; i < targets_.size(); ++i) {
        if (products_[i] != p) continue;
        float* da = grads + lora_offsets_[i];
        adapter(own, i, ws).backward(dev, in, lora_u(s, i, n).input(), dy_g, da, da + a_count(i),
                                     dx, lora_scratch(d), n);
      }
      if (dx16) dev.to_bf16(dx, dx16, elements(n, map.in));
    };
    // MLP branch: out = res1 + down(swiglu(gate_up(h2))). Under bf16 the products read dout
    // rounded into d.dout16, din's storage or a region of the scratch (Note [Backward scratch
    // lifetimes] in gpt.cpp).
    const MatIn dout_g = detail::as_input(dev, dout, d.dout16, elements(n, c_));
    project(kDownProduct, m.down, s.act.input(), dout, dout_g, kDownW, kDownB, d.h, nullptr);
    if (bf16)
      dev.swiglu_backward(s.gu.bf16, d.h, d.dgu, d.grad16, n, f_);
    else
      dev.swiglu_backward(s.gu.f32, d.h, d.dgu, n, f_);
    const MatIn dgu = bf16 ? MatIn{nullptr, d.grad16} : MatIn{d.dgu, nullptr};
    project(kGateUpProduct, m.gate_up, s.ln2.input(), d.dgu, dgu, kGateUpW, kGateUpB, d.tmp,
            nullptr);
    // d res1 = dout + the post-attention norm's input gradient, in bf16 rounded in the same
    // pass into d.grad16, o_proj's products' input; written straight into din, which the input
    // norm's backward then adds to in place (Note [Backward scratch lifetimes] in gpt.cpp).
    float* dres1 = din ? din : d.res1;
    dev.residual_rmsnorm_backward(s.res1, base.post_norm, s.rstd2, d.tmp, dout, dres1,
                                  bf16 ? d.grad16 : nullptr, norm_g(kPostNorm), n, c_);
    // Attention branch: res1 = x + o_proj(attention(rope(qkv(h)))). Under bf16 the gradient of
    // atty is written rounded into d.datty16 (grad16 past d res1's rounding, or dout16's region,
    // free once down's products have run).
    const MatIn dres1_g = bf16 ? MatIn{nullptr, d.grad16} : MatIn{dres1, nullptr};
    project(kOProduct, m.o, s.atty.input(), dres1, dres1_g, kOW, kOB, d.tmp,
            bf16 ? d.datty16 : nullptr);
    const MatIn datty = bf16 ? MatIn{nullptr, d.datty16} : MatIn{d.tmp, nullptr};
    detail::attention_backward(dev, attention_shape(batch, ws), s.qkv.input(), s.atty.input(), datty,
                               attention_buffers(s, d), d.qkv);
    // q and k rotated back, and under bf16 the whole dqkv rounded into d.grad16 in that pass.
    dev.rope_backward(rope_shape(batch, ws), rope_table(ws), d.qkv, bf16 ? d.grad16 : nullptr);
    const MatIn dqkv = bf16 ? MatIn{nullptr, d.grad16} : MatIn{d.qkv, nullptr};
    project(kQkvProduct, m.qkv, s.ln1.input(), d.qkv, dqkv, kQkvW, kQkvB, d.tmp, nullptr);
    // din += the input norm's input gradient. Its weight needs its backward even without a din
    // (a first layer): its dx then goes to d.res1, from no residual (d.res1 shares storage with
    // d.qkv, read by now; the weight's gradient does not read the residual).
    dev.residual_rmsnorm_backward(x, base.in_norm, s.rstd1, d.tmp, din, din ? din : d.res1,
                                  nullptr, norm_g(kInNorm), n, c_);
  }

  // forward for the newest positions of one sequence (Note [KV cache]): the qkv projection
  // writes their rows into the cache, RoPE rotates them at their positions, and attention reads
  // the cache in full.
  bool decodes() const noexcept override { return true; }
  std::size_t cache_size() const noexcept override { return elements(t_, qkv_width()); }
  std::size_t decode_scratch_size(int count) const noexcept override {
    return Decode::at(nullptr, *this, count).size;
  }
  void decode(Device& dev, const float* params, const float* x, float* out,
              const DecodeStep& step) const override {
    const LayerWorkspace ws{.constants = step.constants};
    const Maps m = maps(params, nullptr, [&](LlamaParam b) { return params + offsets_[b]; });
    const Decode d = Decode::at(step.scratch, *this, step.count);
    const int n = step.count;
    float* qkv = step.cache + elements(step.start, qkv_width());
    dev.residual_rmsnorm_forward(x, nullptr, nullptr, params + offsets_[kInNorm], d.ln, d.rstd,
                                 n, c_, eps_);
    m.qkv.forward(dev, {d.ln, nullptr}, {qkv, nullptr}, nullptr, n);
    dev.rope_forward({1, n, h_, hkv_, d_, step.start}, rope_table(ws), qkv);
    detail::cached_attention(dev, attention_shape(1), step.cache, step.start, n, d.scores,
                             d.atty);
    m.o.forward(dev, {d.atty, nullptr}, {d.res1, nullptr}, nullptr, n);
    dev.residual_rmsnorm_forward(d.res1, x, d.res1, params + offsets_[kPostNorm], d.ln, d.rstd,
                                 n, c_, eps_);
    m.gate_up.forward(dev, {d.ln, nullptr}, {d.gu, nullptr}, nullptr, n);
    dev.swiglu_forward(d.gu, d.act, n, f_);
    m.down.forward(dev, {d.act, nullptr}, {out, nullptr}, nullptr, n);
    dev.add(out, d.res1, out, elements(n, c_));
  }

 private:
  struct Saved;
  struct Scratch;
  bool lora() const noexcept { return rank_ > 0; }
  std::vector<ParamTensor> base_tensors(const std::string& prefix) const {
    std::size_t offsets[kLlamaParams];
    return llama_block_tensors(prefix, widths(), offsets);
  }
  // The base tensors as a call reads them: the norms' fp32 weights and the four maps.
  struct Maps {
    Projection qkv, o, gate_up, down;
  };
  struct Base {
    const float* in_norm;    // (C)
    const float* post_norm;  // (C)
    Maps maps;
  };
  // Without LoRA the block's own parameters (and their bf16 copy under bf16); with LoRA the
  // frozen base's, which under bf16 are bf16 bits only (Note [Frozen parameters] in lora.cpp):
  // the products read them as they are, and the few values read in fp32, the norms' weights and
  // the biases, are widened into d.base32 (C, C, then the biases in storage order).
  Base base_of(Device& dev, const float* own, const LayerWorkspace& ws, const Scratch& d) const {
    const bool bf16 = ws.precision == Precision::bf16;
    const float* params = own;
    if (lora()) {
      params = bf16 ? nullptr : ws.frozen;
      if (!(bf16 ? ws.frozen_bf16 != nullptr : ws.frozen != nullptr))
        throw std::logic_error("llama block: LoRA needs the frozen base weights");
    }
    const std::uint16_t* params16 = !bf16 ? nullptr : lora() ? ws.frozen_bf16 : ws.params_bf16;
    if (params) {
      const auto bias = [&](LlamaParam b) { return params + offsets_[b]; };
      return {params + offsets_[kInNorm], params + offsets_[kPostNorm],
              maps(params, params16, bias)};
    }
    float* widened[kLlamaParams] = {};
    Carver k(d.base32);
    for (const auto& [i, count] : widened_tensors()) {
      widened[i] = k.take(count);
      dev.from_bf16(params16 + offsets_[i], widened[i], count);
    }
    const auto bias = [&](LlamaParam b) -> const float* { return widened[b]; };
    return {widened[kInNorm], widened[kPostNorm], maps(nullptr, params16, bias)};
  }
  // What base_of widens under bf16 with LoRA: the norms' weights and the biases the spec has.
  std::vector<std::pair<LlamaParam, std::size_t>> widened_tensors() const {
    const std::size_t c = std::size_t(c_), f = std::size_t(f_);
    std::vector<std::pair<LlamaParam, std::size_t>> out = {{kInNorm, c}, {kPostNorm, c}};
    if (qkv_bias_) out.emplace_back(kQkvB, std::size_t(qkv_width()));
    if (proj_bias_) {
      out.emplace_back(kOB, c);
      out.emplace_back(kGateUpB, 2 * f);
      out.emplace_back(kDownB, c);
    }
    return out;
  }
  std::size_t widened_count() const {
    std::size_t count = 0;
    for (const auto& t : widened_tensors()) count += t.second;
    return count;
  }

  // The targets in storage order (lora_target_names()), each with its product.
  void add_targets(const LoraSpec& lora) {
    const int q = q_width(), kv = hkv_ * d_, w = qkv_width();
    struct Known {
      const char* name;
      const char* module;
      Product product;
      int in, out, col, ldy;
    };
    const Known known[] = {
        {"q_proj", ".self_attn.q_proj", kQkvProduct, c_, q, 0, w},
        {"k_proj", ".self_attn.k_proj", kQkvProduct, c_, kv, q, w},
        {"v_proj", ".self_attn.v_proj", kQkvProduct, c_, kv, q + kv, w},
        {"o_proj", ".self_attn.o_proj", kOProduct, q, c_, 0, c_},
        {"gate_proj", ".mlp.gate_proj", kGateUpProduct, c_, f_, 0, 2 * f_},
        {"up_proj", ".mlp.up_proj", kGateUpProduct, c_, f_, f_, 2 * f_},
        {"down_proj", ".mlp.down_proj", kDownProduct, f_, c_, 0, c_}};
    for (const std::string& name : lora.targets)
      if (std::none_of(std::begin(known), std::end(known), [&](const Known& k) { return name == k.name; }))
        throw std::invalid_argument(fmt::format(
            "llama block: LoRA target '{}' is none of q_proj, k_proj, v_proj, o_proj, "
            "gate_proj, up_proj, down_proj", name));
    for (const Known& k : known) {
      if (std::find(lora.targets.begin(), lora.targets.end(), k.name) == lora.targets.end())
        continue;
      targets_.push_back({k.name, k.module, k.in, k.out, k.col, k.ldy});
      products_.push_back(k.product);
      lora_offsets_.push_back(lora_count_);
      lora_count_ += std::size_t(rank_) * (k.in + k.out);
    }
    if (targets_.empty())
      throw std::invalid_argument("llama block: LoRA needs at least one target");
  }
  const std::vector<LoraTarget>& lora_targets() const { return targets_; }
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

  Widths widths() const {
    return {c_, std::int64_t(h_) * d_, std::int64_t(hkv_) * d_, f_, qkv_bias_, proj_bias_};
  }
  int q_width() const { return h_ * d_; }
  int qkv_width() const { return (h_ + 2 * hkv_) * d_; }

  // The four maps: weights from the bf16 tensors `params16` when set, else from the fp32
  // `params`; a bias from bias(b) (fp32) and, under bf16, its bf16 copy.
  template <class Bias>
  Maps maps(const float* params, const std::uint16_t* params16, const Bias& bias) const {
    const auto map = [&](LlamaParam w, LlamaParam b, bool has_bias, int in, int out) {
      const MatIn weight = params16 ? MatIn{nullptr, params16 + offsets_[w]}
                                    : MatIn{params + offsets_[w], nullptr};
      if (!has_bias) return Projection{weight, nullptr, nullptr, in, out};
      return Projection{weight, bias(b), params16 ? params16 + offsets_[b] : nullptr, in, out};
    };
    return {map(kQkvW, kQkvB, qkv_bias_, c_, qkv_width()),
            map(kOW, kOB, proj_bias_, q_width(), c_),
            map(kGateUpW, kGateUpB, proj_bias_, c_, 2 * f_),
            map(kDownW, kDownB, proj_bias_, f_, c_)};
  }

  // Grouped-query attention: query head h reads kv head h / (H / Hkv).
  // Packed sequences: the rows' own positions (Note [Packed attention] in attention.hpp).
  AttentionShape attention_shape(int batch, const LayerWorkspace& ws) const {
    return attention_shape(batch, ws.positions);
  }
  AttentionShape attention_shape(int batch, const std::int32_t* positions = nullptr) const {
    return {batch, t_, h_, d_, hkv_, positions};
  }
  RopeShape rope_shape(int batch, const LayerWorkspace& ws) const {
    return {batch, t_, h_, hkv_, d_, 0, ws.positions};
  }
  // cos then sin (positions, D / 2) in the replica's copy of the table (Note [Layer constants]).
  RopeTable rope_table(const LayerWorkspace& ws) const {
    if (!ws.constants) throw std::logic_error("llama block: no RoPE table in the workspace");
    const std::size_t plane = std::size_t(rope_.positions) * std::size_t(rope_.half);
    return {ws.constants, ws.constants + plane, rope_.positions};
  }

  // What forward keeps for backward, rows N. Under bf16 the matrix-product inputs (the norms'
  // outputs, qkv after RoPE, the probabilities, atty, gate|up and the SwiGLU output) are bf16;
  // res1 and the norms' statistics stay fp32. ln1, ln2, act and res1, what recompute() rewrites,
  // come last, or from `recomputed` when that is set (LayerWorkspace::recomputed); `recomputed`
  // counts their floats.
  struct Saved {
    float* rstd1;    // (N)
    Kept qkv;        // (N, W), q and k rotated
    Kept att;        // materialised: (B, H, T, T) probabilities
    float* lse;      // fused: (B, H, T)
    Kept atty;       // (N, Q)
    float* res1;     // (N, C)
    float* rstd2;    // (N)
    Kept gu;         // (N, 2F) gate | up
    Kept ln1, ln2;   // (N, C) each
    Kept act;        // (N, F) silu(gate) * up
    Kept lora_u;     // LoRA: (targets, N, rank), each target's s x A^T
    std::size_t size, recomputed;
    static Saved at(float* base, float* recomputed, const LlamaBlock& b, int batch, bool bf16) {
      const std::size_t n = std::size_t(batch) * b.t_, c = b.c_, f = b.f_;
      const std::size_t rows = std::size_t(batch) * b.h_ * b.t_;  // (B, H, T)
      Carver k(base);
      const auto kept = [&](Carver& in, std::size_t count) { return Kept::take(in, count, bf16); };
      Saved s{k.take(n), kept(k, n * b.qkv_width()), kept(k, b.fused_ ? 0 : rows * b.t_),
              k.take(b.fused_ ? rows : 0), kept(k, n * b.q_width()), nullptr, k.take(n),
              kept(k, 2 * n * f), {}, {}, {}, kept(k, b.targets_.size() * n * b.rank_), 0, 0};
      Carver apart(recomputed), measure(nullptr);
      Carver& r = recomputed ? apart : k;
      s.ln1 = kept(r, n * c);
      s.ln2 = kept(r, n * c);
      s.act = kept(r, n * f);
      s.res1 = r.take(n * c);
      for (std::size_t count : {n * c, n * c, n * f}) (void)kept(measure, count);
      (void)measure.take(n * c);
      s.size = k.used();
      s.recomputed = measure.used();
      return s;
    }
  };

  // One of forward's products: the map's, and the adapters that add into its output (Note
  // [LoRA] in lora.cpp): with adapters and a bf16 y, the base's product and theirs are summed in
  // the fp32 `product` and rounded into y once.
  struct ProductCall {
    Product p;
    const Projection& map;
    const Kept& in;
    MatOut y;
    float* product;
  };
  void project_forward(Device& dev, const float* own, const LayerWorkspace& ws, const Saved& s,
                       const Scratch& d, const ProductCall& call, int n) const {
    const bool sum_first = lora() && call.y.bf16;
    call.map.forward(dev, call.in.input(), sum_first ? MatOut{call.product, nullptr} : call.y,
                     call.product, n);
    float* sum = sum_first ? call.product : call.y.f32;
    for (std::size_t i = 0; i < targets_.size(); ++i)
      if (products_[i] == call.p)
        adapter(own, i, ws).forward(dev, call.in.input(), sum, lora_u(s, i, n).output(),
                                    lora_scratch(d), n);
    if (sum_first) dev.to_bf16(call.product, call.y.bf16, elements(n, call.map.out));
  }

  // res1 = x + o_proj(atty) (its adapters too), and the post-attention RMSNorm of it, in one
  // pass (Note [Residual LayerNorm]): forward's calls, which recompute() makes again on the kept
  // atty and x (Note [Recomputation] in src/model/model.cpp).
  void residual1(Device& dev, const float* own, const LayerWorkspace& ws, const Saved& s,
                 const Scratch& d, const Base& base, const float* x, int n) const {
    project_forward(dev, own, ws, s, d, {kOProduct, base.maps.o, s.atty, {s.res1, nullptr},
                                         nullptr}, n);
    s.ln2.store([&](auto* y) {
      dev.residual_rmsnorm_forward(s.res1, x, s.res1, base.post_norm, y, s.rstd2, n, c_, eps_);
    });
  }

  // act = silu(gate) * up, from the kept gate | up.
  void swiglu(Device& dev, const Saved& s, int n) const {
    if (s.gu.bf16)
      dev.swiglu_forward(s.gu.bf16, s.act.bf16, n, f_);
    else
      dev.swiglu_forward(s.gu.f32, s.act.f32, n, f_);
  }

  // Backward's temporaries; forward's too under bf16 (products' fp32 outputs before rounding).
  // As in a GPT-2 block (Note [Backward scratch lifetimes] in gpt.cpp), those whose lifetimes
  // are disjoint share storage, in two regions. backward() runs: down (writes h) -> SwiGLU's
  // backward (reads h, writes dgu) -> gate_up (reads dgu, writes tmp) -> post norm (reads tmp,
  // dout, writes d res1) -> o_proj (reads d res1, writes tmp | datty16) -> attention (reads
  // tmp | datty16, writes qkv) -> RoPE, qkv (reads qkv, writes tmp) -> input norm (reads tmp,
  // d res1, writes din). So region 1 holds h (dead once SwiGLU's backward has read it), then
  // tmp; region 2 dgu (dead after gate_up), then qkv; d res1 is din itself, or without a din (a
  // first layer) the front of region 2 between the post norm and o_proj, where the input
  // norm's discarded dx goes too. Under bf16 with a din and the fused path, dout16 (read by
  // down's products, before the post norm writes d res1) lies in din's storage and datty16 in
  // grad16 past d res1's rounding, as a GPT-2 block's; otherwise both share a region of their
  // own. LoRA's adapters read and write only their own temporaries below and the products'
  // operands named here.
  struct Scratch {
    float* h;     // region 1: (N, F) gradient of the SwiGLU output
    float* tmp;   // region 1: (N, max(C, Q)) gradient at a norm's output or of atty; atty's product
    float* dgu;   // region 2: (N, 2F) gradient of gate | up; forward: gate_up's product under bf16
    float* qkv;   // region 2: (N, W) gradient of qkv; forward: qkv's product under bf16
    float* res1;  // region 2: (N, C) gradient of the first residual, for a block without din
    float* att;   // materialised: (B, H, T, T)
    // bf16 only: a gradient rounded as a matrix-product input, max((N, 2F), (N, W), att).
    std::uint16_t* grad16;
    // bf16 only: (N, C) dout rounded, and (N, Q) the gradient of atty rounded: with a din and
    // the fused path in din's storage and in grad16 from the first 64-byte line past d res1's
    // rounding; otherwise both in one (N, max(C, Q)) region, one after the other.
    std::uint16_t* dout16;
    std::uint16_t* datty16;
    float* lora_du;  // LoRA: (N, rank), an adapter's du
    float* sink;     // LoRA: (C), the frozen norms' weight gradients, discarded
    // LoRA with dropout: (N, max(C, Q, F)), an adapter's dropped input; in its backward, its
    // input gradient before the mask.
    float* lora_x;
    std::uint16_t* lora_du16;  // LoRA under bf16: (N, rank), du rounded
    std::uint16_t* lora_x16;   // LoRA with dropout under bf16: (N, max(C, Q, F)), lora_x rounded
    float* base32;             // LoRA under bf16: the widened base tensors (widened_tensors())
    std::size_t size;
    // with_din: for a backward that gets din (its storage when set).
    static Scratch at(float* base, const LlamaBlock& b, int batch, bool bf16, bool with_din,
                      float* din = nullptr) {
      const std::size_t n = std::size_t(batch) * b.t_, c = b.c_, f = b.f_;
      const std::size_t wide = std::max<std::size_t>(c, b.q_width());
      const std::size_t att = b.fused_ ? 0 : std::size_t(batch) * b.h_ * b.t_ * b.t_;
      const std::size_t widest = std::max({2 * n * f, n * b.qkv_width(), n * c, att});
      const std::size_t past_dres1 = 2 * detail::bf16_floats(n * c);
      const bool in_din = bf16 && b.fused_ && with_din && past_dres1 + n * b.q_width() <= widest;
      Carver k(base);
      float* region1 = k.take(std::max(n * f, n * wide));
      float* region2 = k.take(std::max({2 * n * f, n * b.qkv_width(), n * c}));
      float* att_d = k.take(att);
      std::uint16_t* grad16 = bf16 ? k.take_bf16(widest) : nullptr;
      std::uint16_t* region = bf16 && !in_din ? k.take_bf16(n * wide) : nullptr;
      Scratch s{region1, region1, region2, region2, region2, att_d, grad16,
                in_din ? reinterpret_cast<std::uint16_t*>(din) : region,
                in_din && grad16 ? grad16 + past_dres1 : region,
                k.take(b.lora() ? n * b.rank_ : 0), k.take(b.lora() ? c : 0),
                k.take(b.lora_dropout_ > 0.0f ? n * std::max({c, wide, f}) : 0),
                bf16 && b.lora() ? k.take_bf16(n * b.rank_) : nullptr,
                bf16 && b.lora_dropout_ > 0.0f ? k.take_bf16(n * std::max({c, wide, f}))
                                               : nullptr,
                k.take(bf16 && b.lora() ? b.widened_count() : 0), 0};
      s.size = k.used();
      return s;
    }
  };

  // decode()'s scratch for n positions.
  struct Decode {
    float *ln, *rstd;  // (n, C), (n)
    float* scores;     // (H, n, up to T)
    float *atty;       // (n, Q)
    float *res1;       // (n, C)
    float *gu, *act;   // (n, 2F), (n, F)
    std::size_t size;
    static Decode at(float* base, const LlamaBlock& b, int count) {
      const std::size_t n = std::size_t(count), c = b.c_, f = b.f_;
      Carver k(base);
      Decode d{k.take(n * c), k.take(n), k.take(std::size_t(b.h_) * n * b.t_),
               k.take(n * b.q_width()), k.take(n * c), k.take(2 * n * f), k.take(n * f), 0};
      d.size = k.used();
      return d;
    }
  };

  static detail::LoraScratch lora_scratch(const Scratch& d) {
    return {d.lora_x, d.lora_x16, d.lora_du, d.lora_du16};
  }

  detail::AttentionBuffers attention_buffers(const Saved& s, const Scratch& d) const {
    if (fused_) return {.path = AttentionKind::fused, .lse = s.lse};
    return {.path = AttentionKind::materialized, .probs = s.att.output(), .squares = d.att,
            .squares16 = d.grad16, .y_product = d.tmp};
  }

  static std::size_t elements(int rows, int cols) { return std::size_t(rows) * std::size_t(cols); }

  int t_, c_, h_, hkv_, d_, f_;
  float eps_;
  bool qkv_bias_, proj_bias_, fused_;
  RopeConstants rope_;
  std::size_t offsets_[kLlamaParams] = {};
  std::size_t count_ = 0;
  // LoRA (rank_ 0: none): the targets, the product each adds into, and where each one's A then
  // B lie in the block's parameters.
  int rank_ = 0;
  float lora_scale_ = 0.0f;
  float lora_dropout_ = 0.0f;
  std::vector<LoraTarget> targets_;
  std::vector<Product> products_;
  std::vector<std::size_t> lora_offsets_;
  std::size_t lora_count_ = 0;
};

}  // namespace

std::unique_ptr<Layer> make_llama_block(const GptSpec& spec, AttentionKind attention,
                                        RopeConstants rope, const LoraSpec& lora) {
  if (lora.rank < 0)
    throw std::invalid_argument(fmt::format("llama block: LoRA rank {} is negative", lora.rank));
  return std::make_unique<LlamaBlock>(spec, attention, std::move(rope), lora);
}

}  // namespace lockstep
