// cuDNN's fused causal attention through the frontend's graph API (Note [cuDNN attention] in
// cudnn_attention.hpp). The only translation unit that includes cudnn_frontend.h.
#include "cuda/cudnn_attention.hpp"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "common/once_cache.hpp"

namespace lockstep::cuda {
namespace fe = cudnn_frontend;
namespace {

// The graphs' tensors, by uid. dO sits where O does in its own buffer; dQ, dK, dV where Q, K, V.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv, kBias };

std::string describe(const AttentionKey& k) {
  return fmt::format("{} (B {}, T {}, H {}, Hkv {}, D {}{}{})",
                     k.backward ? "sdpa_backward" : "sdpa", k.batch, k.T, k.heads, k.kv_heads,
                     k.head_size, k.backward && !k.deterministic ? ", nondeterministic" : "",
                     k.packed ? ", packed: a (B, 1, T, T) bias" : "");
}

// A frontend call's error as an exception naming the call, the graph and cuDNN's message.
void check(const fe::error_t& status, const char* call, const AttentionKey& key) {
  if (status.is_good()) return;
  fe::error_t copy = status;
  throw std::runtime_error(fmt::format("cudnn frontend: {} of {} failed: {}", call, describe(key),
                                       copy.get_message()));
}

void check(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw std::runtime_error(
      fmt::format("cudnn: {} failed: {}", call, cudnnGetErrorString(status)));
}

std::vector<std::int64_t> as_vector(const std::array<std::int64_t, 4>& a) {
  return {a.begin(), a.end()};
}

// One built graph and the workspace its plan needs.
struct Built {
  std::shared_ptr<const fe::graph::Graph> graph;
  std::size_t workspace = 0;
};

// The graph of one shape and direction, validated and with its plan built (the heuristics' first
// choice that cuDNN supports). Throws naming the step that refused it.
Built build(cudnnHandle_t handle, const AttentionKey& key) {
  const AttentionShape shape{key.batch, key.T, key.heads, key.head_size, key.kv_heads};
  const AttentionLayout at = attention_layout(shape);
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto tensor = [&](const char* name, Uid uid, const TensorLayout& l) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim(as_vector(l.dim))
                             .set_stride(as_vector(l.stride)));
  };
  const auto output = [](const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid,
                         const TensorLayout& l) -> fe::graph::Tensor_attributes& {
    return t->set_output(true).set_uid(uid).set_dim(as_vector(l.dim)).set_stride(
        as_vector(l.stride));
  };
  const auto q = tensor("Q", kQ, at.q), k = tensor("K", kK, at.k), v = tensor("V", kV, at.v);
  // Packed sequences: their block-diagonal mask as an additive bias (Note [cuDNN packed mask]).
  auto bias = key.packed ? tensor("Bias", kBias, at.bias) : nullptr;
  const float scale = 1.0f / std::sqrt(float(key.head_size));
  if (!key.backward) {
    // COMPOSITE: Pinned choices in cudnn_attention.hpp.
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("sdpa")
                          .set_implementation(fe::AttentionImplementation_t::COMPOSITE)
                          .set_generate_stats(true)
                          .set_causal_mask(true)
                          .set_attn_scale(scale);
    if (bias) attributes.set_bias(bias);
    auto [o, stats] = graph->sdpa(q, k, v, attributes);
    output(o, kO, at.o);
    output(stats, kStats, at.stats).set_data_type(fe::DataType_t::FLOAT);
  } else {
    const auto o = tensor("O", kO, at.o), d_o = tensor("dO", kDo, at.o);
    const auto stats = tensor("Stats", kStats, at.stats);
    stats->set_data_type(fe::DataType_t::FLOAT);
    // Deterministic: the same inputs give the same gradient bits on every run and replica
    // (Pinned choices in cudnn_attention.hpp).
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("sdpa_backward")
                          .set_causal_mask(true)
                          .set_attn_scale(scale)
                          .set_deterministic_algorithm(key.deterministic);
    if (bias) attributes.set_bias(bias);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, d_o, stats, attributes);
    // The gradients in their own buffer of qkv's shape, laid out as q, k, v in qkv.
    output(dq, kDq, at.q);
    output(dk, kDk, at.k);
    output(dv, kDv, at.v);
  }
  check(graph->validate(), "validate", key);
  check(graph->build_operation_graph(handle), "build_operation_graph", key);
  check(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", key);
  check(graph->check_support(handle), "check_support", key);
  check(graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans", key);
  std::int64_t workspace = 0;
  check(graph->get_workspace_size(workspace), "get_workspace_size", key);
  return {std::move(graph), static_cast<std::size_t>(workspace)};
}

// A cuDNN handle, destroyed with its owner.
struct Handle {
  cudnnHandle_t h = nullptr;
  Handle() { check(cudnnCreate(&h), "cudnnCreate"); }
  ~Handle() {
    if (h) cudnnDestroy(h);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

// Note [cuDNN plan cache]
//   Building a graph's plan takes cuDNN seconds (it compiles the kernel), and every device
//   would build the same ones: four peer replicas on one GPU, or a test's devices one after
//   another. So the built graphs live in one cache per process, keyed by the GPU and the graph's
//   key, each built once, by the first thread to ask; a thread asking for it meanwhile waits for
//   that build, and threads asking for other keys build theirs at the same time (one worker
//   thread per device builds its plans concurrently). A refusal is kept like a graph: every
//   later ask rethrows it, without building again (OnceCache, src/common/once_cache.hpp, tested
//   without a GPU in tests/common/test_once_cache.cpp).
//   Sharing is what the frontend provides for (1.32, graph_interface.h): a built Graph executes
//   with any handle on its device, and execute() is marked thread-safe (it copies the variant
//   pack's template to the stack and patches it there). A handle is used by one thread at a
//   time (cuDNN's thread-safety rule), so the builds take handles of the cache's own, one per
//   build in flight, and each device executes with its own handle on its own stream. The
//   cache's handles and graphs are never destroyed, as the process's other CUDA state at exit.
class PlanCache {
 public:
  static PlanCache& instance() {
    static auto* cache = new PlanCache;  // never destroyed: Note [cuDNN plan cache]
    return *cache;
  }

  // The graph of `key` on the current GPU, built on first ask; rethrows its refusal.
  std::shared_ptr<const Built> get(const AttentionKey& key) {
    int device = 0;
    if (const cudaError_t status = cudaGetDevice(&device); status != cudaSuccess)
      throw std::runtime_error(
          fmt::format("cuda: cudaGetDevice failed: {}", cudaGetErrorString(status)));
    return plans_.get({device, key}, [&] { return build_on(device, key); });
  }

 private:
  PlanCache() = default;

  Built build_on(int device, const AttentionKey& key) {
    const cudnnHandle_t handle = take_handle(device);
    try {
      Built built = build(handle, key);
      give_back(device, handle);
      return built;
    } catch (...) {
      give_back(device, handle);
      throw;
    }
  }
  cudnnHandle_t take_handle(int device) {
    {
      const std::lock_guard lock(mutex_);
      std::vector<cudnnHandle_t>& idle = idle_[device];
      if (!idle.empty()) {
        const cudnnHandle_t h = idle.back();
        idle.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;  // on the current device, which is `device`
    check(cudnnCreate(&h), "cudnnCreate");
    return h;
  }
  void give_back(int device, cudnnHandle_t handle) {
    const std::lock_guard lock(mutex_);
    idle_[device].push_back(handle);
  }

  lockstep::detail::OnceCache<std::pair<int, AttentionKey>, Built> plans_;  // by GPU and key
  std::mutex mutex_;  // guards idle_
  std::map<int, std::vector<cudnnHandle_t>> idle_;  // by GPU: handles no build is using
};

// The frontend's variant pack holds void*: the inputs' const goes here, cuDNN only reads them.
template <class T>
void* in(const T* p, std::int64_t offset = 0) {
  return const_cast<T*>(p + offset);
}

}  // namespace

long cudnn_runtime_version() { return static_cast<long>(cudnnGetVersion()); }

std::string cudnn_versions() {
  return fmt::format("cuDNN {} loaded (headers {}), frontend {}.{}.{}, SDPA forward composite",
                     cudnn_version_text(cudnn_runtime_version()), cudnn_version_text(CUDNN_VERSION),
                     CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
}

std::string cudnn_attention_probe(const AttentionShape& shape) {
  const bool deterministic = cudnn_backward_deterministic_from_env();
  try {
    PlanCache::instance().get(attention_key(shape, false));
    PlanCache::instance().get(attention_key(shape, true, deterministic));
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

struct CudnnAttention::Impl {
  Handle handle;
  bool deterministic = true;
  // This device's graphs, from the process's cache (Note [cuDNN plan cache]): looked up here
  // without a lock at every call after the first.
  std::map<AttentionKey, std::shared_ptr<const Built>> graphs;

  const Built& graph(const AttentionShape& shape, bool backward) {
    const AttentionKey key = attention_key(shape, backward, deterministic);
    auto it = graphs.find(key);
    if (it == graphs.end()) it = graphs.emplace(key, PlanCache::instance().get(key)).first;
    return *it->second;
  }

  void execute(const AttentionShape& shape, bool backward,
               std::unordered_map<std::int64_t, void*>& pointers, void* workspace) {
    const Built& built = graph(shape, backward);
    check(built.graph->execute(handle.h, pointers, workspace), "execute",
          attention_key(shape, backward, deterministic));
  }
};

CudnnAttention::CudnnAttention(CUstream_st* stream, bool deterministic)
    : impl_(std::make_unique<Impl>()) {
  impl_->deterministic = deterministic;
  check(cudnnSetStream(impl_->handle.h, stream), "cudnnSetStream");
}

CudnnAttention::~CudnnAttention() = default;

std::size_t CudnnAttention::workspace_bytes(const AttentionShape& shape, bool backward) {
  return impl_->graph(shape, backward).workspace;
}

void CudnnAttention::forward(const AttentionShape& shape, const std::uint16_t* qkv,
                             std::uint16_t* y, float* lse, void* workspace,
                             const std::uint16_t* bias) {
  const AttentionLayout at = attention_layout(shape);
  std::unordered_map<std::int64_t, void*> pointers{
      {kQ, in(qkv, at.q.offset)}, {kK, in(qkv, at.k.offset)}, {kV, in(qkv, at.v.offset)},
      {kO, y}, {kStats, lse}};
  if (shape.positions) pointers.emplace(kBias, in(bias));
  impl_->execute(shape, false, pointers, workspace);
}

void CudnnAttention::backward(const AttentionShape& shape, const std::uint16_t* qkv,
                              const std::uint16_t* y, const std::uint16_t* dy, const float* lse,
                              std::uint16_t* dqkv, void* workspace, const std::uint16_t* bias) {
  const AttentionLayout at = attention_layout(shape);
  std::unordered_map<std::int64_t, void*> pointers{
      {kQ, in(qkv, at.q.offset)},   {kK, in(qkv, at.k.offset)},   {kV, in(qkv, at.v.offset)},
      {kO, in(y)},                  {kDo, in(dy)},                {kStats, in(lse)},
      {kDq, dqkv + at.q.offset},    {kDk, dqkv + at.k.offset},    {kDv, dqkv + at.v.offset}};
  if (shape.positions) pointers.emplace(kBias, in(bias));
  impl_->execute(shape, true, pointers, workspace);
}

}  // namespace lockstep::cuda
