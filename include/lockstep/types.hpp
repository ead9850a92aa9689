// The small value types every part of the API shares: the enums the config selects (activation,
// dataset, optimiser, backend, ...) and the vocabulary limits. Headers that only need these
// (device, model, dataset) include this one, not the whole config schema.
//
//   lockstep::Activation f = lockstep::Activation::gelu;
//   std::string_view name = lockstep::to_string(f);   // "gelu", as spelt in the YAML
#pragma once

#include <optional>
#include <string_view>

#include "lockstep/export.hpp"

namespace lockstep {

enum class Activation { relu, gelu, tanh };
// given: the program passes the datasets to the Trainer itself (a C++ embedder, Python's
// lockstep.Trainer(config, train=...)); the config names no data, and load_dataset() refuses it.
enum class DatasetKind { csv, idx, synthetic, tokens, text, chat, given };
enum class TokenFormat { automatic, llmc, raw };
enum class OptimizerKind { sgd, adamw };
enum class ScheduleKind { constant, warmup_cosine };
enum class BackendKind { automatic, cpu, cuda };
enum class CommKind { automatic, nccl, peer };
enum class NonfinitePolicy { stop, skip };
// What a worker's device-class failure does (trainer.on_worker_failure): stop the run, or go on
// with the survivors (Note [Shrink] in src/train/recovery.hpp).
enum class WorkerFailurePolicy { stop, shrink };
// The arithmetic of matrix products: fp32, TF32 tensor cores (cuda), or bf16 mixed precision.
enum class Precision { fp32, tf32, bf16 };
// The element type of the gradients on the all-reduce's wire (trainer.grad_reduce_dtype).
enum class ReduceDtype { fp32, bf16 };
// How a GPT block computes attention (model.attention): `fused` never holds the (T, T) matrices
// (the CPU's tiled online softmax), `materialized` does (the reference); `automatic` ("auto")
// picks the fused path where the backend has one that measured at least as fast
// (choose_attention in lockstep/device.hpp).
enum class AttentionKind { automatic, fused, materialized };
// Whether a GPU replays each micro-batch's forward and backward as device graphs
// (trainer.cuda_graphs; Note [Step graphs] in src/train/step_graphs.hpp): `automatic` ("auto")
// keeps them only where they measured faster than launching each kernel.
enum class GraphMode { automatic, on, off };
// trainer.recompute (Note [Recomputation] in src/model/model.cpp): none keeps every layer's
// saved activations; selective drops a recomputable layer's element-wise outputs (norms, GELU,
// SwiGLU) and recomputes them in backward; full keeps a recomputable layer's input only and
// reruns its forward in backward.
enum class Recompute { none, selective, full };
// A decoder's parts (model.family, model.norm, model.positions, model.mlp; Note [One decoder]
// in src/model/decoder.cpp): GPT-2's LayerNorm, learned positions and GELU MLP, or the Llama
// family's RMSNorm, rotary embeddings and SwiGLU MLP. A family is a preset of the parts.
enum class ModelFamily { gpt2, llama, qwen2, mistral };
enum class NormKind { layernorm, rmsnorm };
enum class PositionKind { learned, rope };
enum class MlpKind { gelu, swiglu };
// model.rope_scaling.type: none, or Llama 3.1's frequency scaling.
enum class RopeScalingKind { none, llama3 };

// The config's spelling of each value (src/config/schema.hpp reads the same tables).
LOCKSTEP_API std::string_view to_string(Activation);
LOCKSTEP_API std::string_view to_string(DatasetKind);
LOCKSTEP_API std::string_view to_string(TokenFormat);
LOCKSTEP_API std::string_view to_string(OptimizerKind);
LOCKSTEP_API std::string_view to_string(ScheduleKind);
LOCKSTEP_API std::string_view to_string(BackendKind);
LOCKSTEP_API std::string_view to_string(CommKind);
LOCKSTEP_API std::string_view to_string(NonfinitePolicy);
LOCKSTEP_API std::string_view to_string(WorkerFailurePolicy);
LOCKSTEP_API std::string_view to_string(Precision);
LOCKSTEP_API std::string_view to_string(ReduceDtype);
LOCKSTEP_API std::string_view to_string(AttentionKind);
LOCKSTEP_API std::string_view to_string(GraphMode);
LOCKSTEP_API std::string_view to_string(Recompute);
LOCKSTEP_API std::string_view to_string(ModelFamily);
LOCKSTEP_API std::string_view to_string(NormKind);
LOCKSTEP_API std::string_view to_string(PositionKind);
LOCKSTEP_API std::string_view to_string(MlpKind);
LOCKSTEP_API std::string_view to_string(RopeScalingKind);

// The backend a spelling of trainer.backend names ("auto", "cpu", "cuda"); nullopt for any other
// text. For options outside a config: `lockstep sample --backend`, Python's sample(backend=).
LOCKSTEP_API std::optional<BackendKind> backend_kind(std::string_view spelling);

// Token ids travel to the embedding as floats, which hold every integer below 2^24 exactly.
inline constexpr int kMaxVocabSize = 1 << 24;
// data.dataset text: one token per byte.
inline constexpr int kByteVocabSize = 256;
// A label that does not count: softmax_cross_entropy gives its row no loss, no correct count
// and a zero gradient (a conversation's prompt, padding; Dataset::masks_targets).
inline constexpr std::int32_t kIgnoreLabel = -1;

}  // namespace lockstep
