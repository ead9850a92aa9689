// LoRA adapters inside a decoder block (Note [LoRA] in lora.cpp): the math of one adapter on one
// projection, forward and backward, in fp32 on the Device's GEMM.
//
// Shapes: N rows; x (N, in) with row stride `in`; the projection's output y and its gradient dy
// are column blocks [col, col + out) of a wider row (stride ldy: q, k and v share one (N, W)
// product, gate and up one (N, 2F)). A (rank, in), B (out, rank); u (N, rank) = s x A^T, kept
// from forward for backward. Backward accumulates into dA, dB (+=) and into dx (+=: the base
// projection's input gradient is already there). With dropout the adapter reads xd = dropout(x)
// instead of x, drawn again in backward, not kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/device.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

struct LoraTarget {
  std::string name;    // PEFT's module name: "q_proj"
  std::string module;  // the tensor's path in the block: ".self_attn.q_proj"
  int in = 0, out = 0;
  int col = 0, ldy = 0;  // the output's column block in its product's rows
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

  bool drops() const { return dropout > 0.0f && key != 0; }
  // The adapter's input: x, or x with the mask applied, written into `dropped` (N, in).
  const float* input(Device& dev, const float* x, float* dropped, int rows) const {
    if (!drops()) return x;
    dev.dropout(x, dropped, std::size_t(rows) * std::size_t(target.in), key, dropout, false);
    return dropped;
  }
  // y[:, col:col+out] += (s xd A^T) B^T; u (N, rank) = s xd A^T, xd = input(x).
  void forward(Device& dev, const float* x, float* y, float* u, float* dropped, int rows) const {
    const LoraTarget& t = target;
    const float* xd = input(dev, x, dropped, rows);
    dev.gemm(Transpose::no, Transpose::yes, rows, rank, t.in, scale, xd, t.in, a, t.in, 0.0f, u,
             rank);
    dev.gemm(Transpose::no, Transpose::yes, rows, t.out, rank, 1.0f, u, rank, b, rank, 1.0f,
             y + t.col, t.ldy);
  }
  // dB (out, rank) += dy^T u; du (N, rank) = s dy B; dA (rank, in) += du^T xd; dx (N, in) +=
  // du A, through the mask when it drops (the mask drawn again into `dropped`, which then
  // holds du A before the mask).
  void backward(Device& dev, const float* x, const float* u, const float* dy, float* da,
                float* db, float* du, float* dx, float* dropped, int rows) const {
    const LoraTarget& t = target;
    const float* g = dy + t.col;
    dev.gemm(Transpose::yes, Transpose::no, t.out, rank, rows, 1.0f, g, t.ldy, u, rank, 1.0f, db,
             rank);
    dev.gemm(Transpose::no, Transpose::no, rows, rank, t.out, scale, g, t.ldy, b, rank, 0.0f, du,
             rank);
    dev.gemm(Transpose::yes, Transpose::no, rank, t.in, rows, 1.0f, du, rank,
             input(dev, x, dropped, rows), t.in, 1.0f, da, t.in);
    if (!drops()) {
      dev.gemm(Transpose::no, Transpose::no, rows, t.in, rank, 1.0f, du, rank, a, t.in, 1.0f, dx,
               t.in);
      return;
    }
    dev.gemm(Transpose::no, Transpose::no, rows, t.in, rank, 1.0f, du, rank, a, t.in, 0.0f,
             dropped, t.in);
    dev.dropout(dropped, dx, std::size_t(rows) * std::size_t(t.in), key, dropout, true);
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

}  // namespace lockstep::detail
