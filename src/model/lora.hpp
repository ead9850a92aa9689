// LoRA adapters inside a decoder block (Note [LoRA] in lora.cpp): the math of one adapter on one
// projection, forward and backward, in fp32 on the Device's GEMM.
//
// Shapes: N rows; x (N, in) with row stride `in`; the projection's output y and its gradient dy
// are column blocks [col, col + out) of a wider row (stride ldy: q, k and v share one (N, W)
// product, gate and up one (N, 2F)). A (rank, in), B (out, rank); u (N, rank) = s x A^T, kept
// from forward for backward. Backward accumulates into dA, dB (+=) and into dx (+=: the base
// projection's input gradient is already there).
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

  // y[:, col:col+out] += (s x A^T) B^T; u (N, rank) = s x A^T.
  void forward(Device& dev, const float* x, float* y, float* u, int rows) const {
    const LoraTarget& t = target;
    dev.gemm(Transpose::no, Transpose::yes, rows, rank, t.in, scale, x, t.in, a, t.in, 0.0f, u,
             rank);
    dev.gemm(Transpose::no, Transpose::yes, rows, t.out, rank, 1.0f, u, rank, b, rank, 1.0f,
             y + t.col, t.ldy);
  }
  // dB (out, rank) += dy^T u; du (N, rank) = s dy B; dA (rank, in) += du^T x; dx (N, in) += du A.
  void backward(Device& dev, const float* x, const float* u, const float* dy, float* da,
                float* db, float* du, float* dx, int rows) const {
    const LoraTarget& t = target;
    const float* g = dy + t.col;
    dev.gemm(Transpose::yes, Transpose::no, t.out, rank, rows, 1.0f, g, t.ldy, u, rank, 1.0f, db,
             rank);
    dev.gemm(Transpose::no, Transpose::no, rows, rank, t.out, scale, g, t.ldy, b, rank, 0.0f, du,
             rank);
    dev.gemm(Transpose::yes, Transpose::no, rank, t.in, rows, 1.0f, du, rank, x, t.in, 1.0f, da,
             t.in);
    dev.gemm(Transpose::no, Transpose::no, rows, t.in, rank, 1.0f, du, rank, a, t.in, 1.0f, dx,
             t.in);
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
