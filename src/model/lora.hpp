// LoRA adapters inside a decoder block (Note [LoRA] in lora.cpp): the math of one adapter on one
// projection, forward and backward, on the Device's GEMM, in fp32 or (bf16 copies of A and B
// set) with bf16 operands as every bf16 product (Note [bf16 compute] in ops.hpp).
//
// Shapes: N rows; x (N, in) with row stride `in`, fp32 or bf16 (as the block keeps it); the
// projection's fp32 output y and its gradient dy are column blocks [col, col + out) of a wider
// row (stride ldy: q, k and v share one (N, W) product, gate and up one (N, 2F)); under bf16
// the products read dy rounded (g). A (rank, in), B (out, rank); u (N, rank) = s x A^T, kept
// from forward for backward (bf16: rounded, as the second product reads it). Backward
// accumulates into dA, dB (+=) and into dx (+=: the base projection's input gradient is
// already there). With dropout the adapter reads xd = dropout(x) instead of x, drawn again in
// backward, not kept (bf16: x widened, dropped, rounded again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/linear.hpp"
#include "lockstep/device.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

struct LoraTarget {
  std::string name;    // PEFT's module name: "q_proj"
  std::string module;  // the tensor's path in the block: ".self_attn.q_proj"
  int in = 0, out = 0;
  int col = 0, ldy = 0;  // the output's column block in its product's rows
};

// An adapter's temporaries, shared by the block's targets.
struct LoraScratch {
  float* dropped = nullptr;            // dropout: (N, in) xd; in backward, du A before the mask
  std::uint16_t* dropped16 = nullptr;  // dropout under bf16: (N, in) xd rounded
  float* du = nullptr;                 // (N, rank) du; forward under bf16: u before rounding
  std::uint16_t* du16 = nullptr;       // bf16: (N, rank) du rounded
};

struct LoraAdapter {
  const float* a;  // (rank, in)
  const float* b;  // (out, rank)
  int rank;
  float scale;     // alpha / rank
  LoraTarget target;
  // Dropout on x (Note [LoRA dropout] in lora.cpp): its probability, and this forward's key for
  // this target's mask; 0 for either: none.
  float dropout = 0.0f;
  std::uint64_t key = 0;
  // bf16: A's and B's bf16 copies, which the products read; null: fp32 products.
  const std::uint16_t* a16 = nullptr;
  const std::uint16_t* b16 = nullptr;

  bool drops() const { return dropout > 0.0f && key != 0; }
  MatIn a_input() const { return a16 ? MatIn{nullptr, a16} : MatIn{a, nullptr}; }
  MatIn b_input() const { return b16 ? MatIn{nullptr, b16} : MatIn{b, nullptr}; }
  // The adapter's input: x, or x with the mask applied, written into s.dropped (and rounded
  // into s.dropped16 when x is bf16).
  MatIn input(Device& dev, MatIn x, const LoraScratch& s, int rows) const {
    if (!drops()) return x;
    const std::size_t n = std::size_t(rows) * std::size_t(target.in);
    if (!x.bf16) {
      dev.dropout(x.f32, s.dropped, n, key, dropout, false);
      return {s.dropped, nullptr};
    }
    dev.from_bf16(x.bf16, s.dropped, n);
    dev.dropout(s.dropped, s.dropped, n, key, dropout, false);
    dev.to_bf16(s.dropped, s.dropped16, n);
    return {nullptr, s.dropped16};
  }
  // y[:, col:col+out] += (s xd A^T) B^T; u (N, rank) = s xd A^T, xd = input(x).
  void forward(Device& dev, MatIn x, float* y, MatOut u, const LoraScratch& s, int rows) const {
    const LoraTarget& t = target;
    const MatIn xd = input(dev, x, s, rows);
    float* u32 = u.bf16 ? s.du : u.f32;
    matmul(dev, Transpose::no, Transpose::yes, rows, rank, t.in, xd, t.in, a_input(), t.in, 0.0f,
           u32, rank, scale);
    if (u.bf16) dev.to_bf16(u32, u.bf16, std::size_t(rows) * std::size_t(rank));
    matmul(dev, Transpose::no, Transpose::yes, rows, t.out, rank, MatIn{u.f32, u.bf16}, rank,
           b_input(), rank, 1.0f, y + t.col, t.ldy);
  }
  // g: dy as the products read it (fp32, or rounded to bf16). dB (out, rank) += g^T u; du (N,
  // rank) = s g B; dA (rank, in) += du^T xd; dx (N, in) += du A, through the mask when it
  // drops (the mask drawn again, s.dropped then holding du A before the mask).
  void backward(Device& dev, MatIn x, MatIn u, MatIn g, float* da, float* db, float* dx,
                const LoraScratch& s, int rows) const {
    const LoraTarget& t = target;
    const MatIn gy = g + t.col;
    matmul(dev, Transpose::yes, Transpose::no, t.out, rank, rows, gy, t.ldy, u, rank, 1.0f, db,
           rank);
    matmul(dev, Transpose::no, Transpose::no, rows, rank, t.out, gy, t.ldy, b_input(), rank, 0.0f,
           s.du, rank, scale);
    const MatIn du = as_bf16(dev, s.du, s.du16, std::size_t(rows) * std::size_t(rank));
    matmul(dev, Transpose::yes, Transpose::no, rank, t.in, rows, du, rank, input(dev, x, s, rows),
           t.in, 1.0f, da, t.in);
    if (!drops()) {
      matmul(dev, Transpose::no, Transpose::no, rows, t.in, rank, du, rank, a_input(), t.in, 1.0f,
             dx, t.in);
      return;
    }
    matmul(dev, Transpose::no, Transpose::no, rows, t.in, rank, du, rank, a_input(), t.in, 0.0f,
           s.dropped, t.in);
    dev.dropout(s.dropped, dx, std::size_t(rows) * std::size_t(t.in), key, dropout, true);
  }

 private:
  // x (n) as a product reads it beside A and B: itself, or rounded into bf16 under bf16.
  MatIn as_bf16(Device& dev, const float* x, std::uint16_t* bf16, std::size_t n) const {
    if (!a16) return {x, nullptr};
    dev.to_bf16(x, bf16, n);
    return {nullptr, bf16};
  }
};

// The adapters' tensors of a block with `targets` enabled, in storage order: for each target
// "{prefix}{module}.lora_A.weight" (rank, in) then ".lora_B.weight" (out, rank).
std::vector<ParamTensor> lora_tensors(const std::string& prefix,
                                      const std::vector<LoraTarget>& targets, int rank);
// A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_ with a = sqrt(5)), B = 0, in storage
// order.
void init_lora(float* params, const std::vector<LoraTarget>& targets, int rank,
               std::uint64_t& rng);

// GPT-2's block (make_block) with adapters on `lora`'s targets (gpt2_lora_target_names() in
// model/lora_targets.hpp); lora.rank 0: make_block's.
std::unique_ptr<Layer> make_gpt_block(int context, int channels, int heads, int n_layer,
                                      AttentionKind attention, const LoraSpec& lora);

}  // namespace lockstep::detail
