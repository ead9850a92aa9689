// cuDNN's fused causal attention (the frontend's graph API), model.attention `fused` on CUDA.
//
//   cuda::CudnnAttention attention(stream);            // a cuDNN handle bound to the stream
//   const std::size_t bytes = attention.workspace_bytes(shape, /*backward=*/true);
//   attention.forward(shape, qkv, y, lse, workspace);   // bf16 qkv (B T, W) -> bf16 y (B T, H D)
//   attention.backward(shape, qkv, y, dy, lse, dqkv, workspace);   // bf16 dqkv (B T, W)
//
// W = qkv_width(shape) = (H + 2 Hkv) D: grouped-query attention's layout (AttentionShape),
// which cuDNN's SDPA takes natively (K and V with fewer heads than Q; its backward sums a kv
// head's gradients over its query heads).
//
// Note [cuDNN attention]: q, k and v are read in place from the qkv buffer through strides, y
// and dqkv written in place the same way (attention_layout below), so no transpose copies exist;
// forward keeps the softmax statistics (fp32, B H T: each row's log-sum-exp of the scaled scores,
// the CPU's `lse`) and backward recomputes the probabilities from them. One graph per shape and
// direction, built on first use (the warm-up's forward and backward, before step 1: Note
// [Warm-up] in src/train/worker_loop.hpp) and kept for the process's life (Note [cuDNN plan
// cache]); executing one allocates nothing and waits for nothing. cuDNN takes half-precision inputs only, so this runs
// under trainer.precision bf16; fp32 and tf32 keep the materialised path (choose_attention).
// Every frontend error becomes a std::runtime_error naming the call, the shape and cuDNN's words.
//
// Pinned choices (cuDNN frontend 1.32, read in its headers):
//   - The forward node's implementation is COMPOSITE (SDPA_attributes::set_implementation), the
//     one this code was written and tested against: under AUTO the frontend takes the UNIFIED
//     node wherever its support surface allows, and a causal mask (a diagonal band) enters that
//     surface at cuDNN 9.21, so a newer cuDNN (PyTorch's wheels) would switch kernels unasked.
//     The backward has no such choice in 1.32 (Graph::sdpa_backward always makes the composite
//     node).
//   - The backward is deterministic (set_deterministic_algorithm): the same gradient bits on
//     every run and replica, which the bit-exact tests and replica checks rely on. On sm_90 the
//     frontend then forces the dP-workspace backward, B H T64 T64 x 2 bytes (T64: T rounded up
//     to 64), unless cuDNN >= 9.25 and CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT asks for the
//     ordered-dQ path (the memory plan counts it: cudnn_attention_backward_bytes in
//     src/train/memory_plan.hpp). LOCKSTEP_CUDNN_BACKWARD=nondeterministic builds the other backward
//     (an fp32 dQ accumulator, B H T D x 4 bytes), for bench_attention to time beside it.
//
// The layout, key and refusal rules are plain host functions (cudnn_attention_rules.cpp, built
// with or without cuDNN and tested without a GPU); the cuDNN types stay in cudnn_attention.cpp,
// one translation unit (the frontend takes about 30 s to compile), built with cuDNN only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/device.hpp"
#include "lockstep/types.hpp"

struct CUstream_st;

namespace lockstep::cuda {

// A tensor as cuDNN's SDPA reads it: dims and strides (in elements) in (B, H, T, D) order, and
// where it starts in its buffer (elements from the buffer's first).
struct TensorLayout {
  std::array<std::int64_t, 4> dim{}, stride{};
  std::int64_t offset = 0;
  friend bool operator==(const TensorLayout&, const TensorLayout&) = default;
};

// q (B, H, T, D), k and v (B, Hkv, T, D) in qkv (B T, (H + 2 Hkv) D) at columns 0, H D and
// (H + Hkv) D with head h at h D of each (AttentionShape's layout; 0, C, 2C of (B T, 3C)
// without grouping); o (and do) in y (B T, H D) with head h at columns h D; the statistics
// (B, H, T, 1), contiguous. The gradients dq, dk, dv take q's, k's and v's layout in their own
// buffer of qkv's shape.
// Packed sequences (AttentionShape::positions): the additive mask `bias` (B, 1, T, T), one
// (T, T) matrix per sequence that every head reads, contiguous.
struct AttentionLayout {
  TensorLayout q, k, v, o, stats, bias;
};
AttentionLayout attention_layout(const AttentionShape& s);

// Which graph: a shape, a direction and (backward) the algorithm.
struct AttentionKey {
  int batch = 0, T = 0, heads = 0, head_size = 0;
  int kv_heads = 0;  // kv_heads_of the shape: never 0 in a key
  bool backward = false;
  bool deterministic = true;  // backward only; forward keys keep true
  bool packed = false;        // the graph adds the (B, 1, T, T) bias of Note [cuDNN packed mask]
  friend auto operator<=>(const AttentionKey&, const AttentionKey&) = default;
};
// packed: shape.positions is set.
AttentionKey attention_key(const AttentionShape& s, bool backward, bool deterministic = true);

// Note [cuDNN packed mask]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A packed window (Note [Packed attention] in src/model/attention.hpp) needs a block-diagonal
// causal mask: the query of row i at position p reads keys i - p .. i. cuDNN's SDPA has masks
// for a causal band and for padding (a sequence length per batch entry), neither of which
// cuts a window into several sequences; its ragged (THD) layout would, with one batch entry per
// sequence, but the graph's batch dimension is fixed while the number of sequences changes
// every step, so it would be sized for B T entries of at most one position each. So the graph
// takes an additive score bias instead, `bias` (B, 1, T, T) in bf16: 0 where row i may read
// key j (i - p <= j <= i), -inf elsewhere, shared by the heads (broadcast over H) and written
// from the positions by a kernel before each call (forward and backward alike, into the front
// of the device's working memory: 2 B T^2 bytes, which the memory plan counts), so nothing
// is kept between them. The causal mask stays set; the bias adds the sequences' left edges.
// With a 0 bias a score is unchanged (x + 0 is x in fp32) and a -inf one is masked out of the
// softmax as the causal mask's are, so every row computes what its sequence would alone in a
// window of its own, up to the order of summation, as on the CPU. The bias never takes a
// gradient (no dBias output). dBias aside, the frontend's validation admits a bias with the
// causal mask and the deterministic backward (cuDNN frontend 1.32); what a GPU's cuDNN builds
// is checked by the GPU tests (tests/cuda/test_cudnn_attention.cpp: on an H200 with cuDNN
// 9.19, 2026-12-04, bench/GPU.md), and model.attention auto takes it for packed data as for
// unpacked.
// The bias's bytes, rounded up to 256 (the working memory's alignment); 0 without positions.
std::size_t packed_bias_bytes(const AttentionShape& s);

// The oldest cuDNN whose SDPA backward runs bf16 causal attention deterministically.
inline constexpr long kMinCudnnVersion = 90000;

// Why cuDNN's fused attention cannot run a head size and a sequence of T positions under a
// precision with cuDNN version `cudnn_version` (cudnnGetVersion's number: 90100 for 9.1.0, 8907
// for 8.9.7); empty when it can. head_size or T 0: not known yet (the graph build then decides).
std::string cudnn_attention_refusal(Precision precision, int head_size, int T,
                                    long cudnn_version);

// "9.19.0" for cudnnGetVersion's 91900, "8.9.7" for 8907.
std::string cudnn_version_text(long version);

// The version of the cuDNN library loaded (cudnnGetVersion), without a GPU.
long cudnn_runtime_version();

// "cuDNN 9.19.0 loaded (headers 9.19.0), frontend 1.32.0, SDPA forward composite": what runs
// the fused attention, for `lockstep devices`, the summary and bench_gpu --probe.
std::string cudnn_versions();

// LOCKSTEP_CUDNN_BACKWARD: deterministic (the default) or nondeterministic; anything else is an
// InputError naming the variable.
bool cudnn_backward_deterministic_from_env();

// Builds the forward and backward graphs of `shape` on the current GPU with a handle of its own
// and returns what refused them (validate, build_plans, ...), or empty when both built. Results
// are remembered per shape for the process's life.
std::string cudnn_attention_probe(const AttentionShape& shape);

class CudnnAttention {
 public:
  // `deterministic`: the backward's algorithm (Pinned choices above).
  CudnnAttention(CUstream_st* stream, bool deterministic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Workspace the shape's graph needs (forward, or backward) in bytes, the graph built first if
  // it is not in the cache. Throws std::runtime_error if cuDNN refuses the shape.
  std::size_t workspace_bytes(const AttentionShape& shape, bool backward);
  // Enqueue on the stream; workspace holds workspace_bytes(shape, direction).
  // Packed shapes (positions set) read `bias` (Note [cuDNN packed mask]); null otherwise.
  void forward(const AttentionShape& shape, const std::uint16_t* qkv, std::uint16_t* y,
               float* lse, void* workspace, const std::uint16_t* bias = nullptr);
  void backward(const AttentionShape& shape, const std::uint16_t* qkv, const std::uint16_t* y,
                const std::uint16_t* dy, const float* lse, std::uint16_t* dqkv, void* workspace,
                const std::uint16_t* bias = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// An owner whose deleter comes with the object, so that code built without cuDNN (where
// cudnn_attention.cpp, and so ~CudnnAttention, is absent) can hold an empty one.
using CudnnAttentionPtr = std::unique_ptr<CudnnAttention, void (*)(CudnnAttention*)>;

}  // namespace lockstep::cuda
