// A CPU device with CUDA's stream-capture semantics (Note [Device graphs] in
// lockstep/device.hpp), and a backend of them, so that the trainer's graphs (Note [Step graphs]
// in src/train/step_graphs.hpp) are tested where CI runs:
//  - during a capture every op is recorded, not run, with its arguments frozen by value, as a
//    kernel's are: a host value that changes per step and is passed to a captured op shows up
//    as a wrong result on replay;
//  - a host sync, an allocation and a copy from the host refuse a capture (throw), as CUDA's
//    thread-local capture mode does; so does any op named in `refuse`, to test the fallback;
//  - a launch runs the recorded ops in order, as a graph launched on the stream does.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpu/cpu_device.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::test {

// What the devices of a backend did, over every run.
struct GraphCounts {
  std::atomic<std::uint64_t> captures{0};  // end_capture calls that returned a graph
  std::atomic<std::uint64_t> launches{0};  // DeviceGraph::launch calls
  std::atomic<std::uint64_t> aborted{0};   // abort_capture calls
  std::atomic<std::uint64_t> recorded{0};  // ops recorded by captures
};

class GraphTestDevice final : public cpu::CpuDevice {
 public:
  GraphTestDevice(int id, int threads, std::string refuse,
                  std::shared_ptr<GraphCounts> counts = std::make_shared<GraphCounts>())
      : CpuDevice(id, threads), refuse_(std::move(refuse)), counts_(std::move(counts)) {}
  const GraphCounts& counts() const noexcept { return *counts_; }

  std::string graphs_unsupported() const override { return {}; }
  void begin_capture() override {
    if (capturing_) throw std::logic_error("GraphTestDevice: a capture is already in progress");
    capturing_ = true;
  }
  std::unique_ptr<DeviceGraph> end_capture() override {
    if (!capturing_) throw std::logic_error("GraphTestDevice: no capture in progress");
    capturing_ = false;
    if (ops_.empty()) return nullptr;
    ++counts_->captures;
    return std::make_unique<Graph>(*this, std::exchange(ops_, {}));
  }
  void abort_capture() noexcept override {
    capturing_ = false;
    ops_.clear();
    ++counts_->aborted;
  }
  // Graphs captured before this are no longer valid() (a GPU's workspace replaced).
  void replace_memory() noexcept { ++epoch_; }

  // ---- Memory and reductions: host syncs, allocations and uploads refuse a capture ----------

  void* allocate(std::size_t bytes) override {
    refused("allocate");
    return CpuDevice::allocate(bytes);
  }
  void deallocate(void* ptr) noexcept override { CpuDevice::deallocate(ptr); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    refused("copy_to_device");
    CpuDevice::copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    refused("copy_to_host");
    CpuDevice::copy_to_host(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    refused("copy");
    CpuDevice::copy(dst, src, bytes);
  }
  void synchronize() override {
    refused("synchronize");
    CpuDevice::synchronize();
  }
  double sum_squares(const float* x, std::size_t n) override {
    refused("sum_squares");
    return CpuDevice::sum_squares(x, n);
  }
  std::uint64_t hash(const float* x, std::size_t n) override {
    refused("hash");
    return CpuDevice::hash(x, n);
  }

  // ---- Every queued op: recorded during a capture ---------------------------------------------

  void fill(float* x, float value, std::size_t n) override {
    op("fill", [=, this] { CpuDevice::fill(x, value, n); });
  }
  void scale(float* x, float alpha, std::size_t n) override {
    op("scale", [=, this] { CpuDevice::scale(x, alpha, n); });
  }
  void add(const float* a, const float* b, float* y, std::size_t n) override {
    op("add", [=, this] { CpuDevice::add(a, b, y, n); });
  }
  void add_bias(float* y, const float* bias, int rows, int cols) override {
    op("add_bias", [=, this] { CpuDevice::add_bias(y, bias, rows, cols); });
  }
  void bias_grad(float* dbias, const float* dy, int rows, int cols) override {
    op("bias_grad", [=, this] { CpuDevice::bias_grad(dbias, dy, rows, cols); });
  }
  void bias_grad(float* dbias, const std::uint16_t* dy, int rows, int cols) override {
    op("bias_grad", [=, this] { CpuDevice::bias_grad(dbias, dy, rows, cols); });
  }
  void activation_forward(Activation f, const float* x, float* y, std::size_t n) override {
    op("activation_forward", [=, this] { CpuDevice::activation_forward(f, x, y, n); });
  }
  void activation_backward(Activation f, const float* x, const float* dy, float* dx,
                           std::size_t n) override {
    op("activation_backward", [=, this] { CpuDevice::activation_backward(f, x, dy, dx, n); });
  }
  void add_bias(const float* x, const std::uint16_t* bias, std::uint16_t* y, int rows,
                int cols) override {
    op("add_bias", [=, this] { CpuDevice::add_bias(x, bias, y, rows, cols); });
  }
  void activation_forward(Activation f, const std::uint16_t* x, std::uint16_t* y,
                          std::size_t n) override {
    op("activation_forward", [=, this] { CpuDevice::activation_forward(f, x, y, n); });
  }
  void activation_backward(Activation f, const std::uint16_t* x, const float* dy, float* dx,
                           std::uint16_t* dx_bf16, std::size_t n) override {
    op("activation_backward",
       [=, this] { CpuDevice::activation_backward(f, x, dy, dx, dx_bf16, n); });
  }  void swiglu_forward(const float* h, float* y, int rows, int F) override {
    op("swiglu_forward", [=, this] { CpuDevice::swiglu_forward(h, y, rows, F); });
  }
  void swiglu_forward(const std::uint16_t* h, std::uint16_t* y, int rows, int F) override {
    op("swiglu_forward", [=, this] { CpuDevice::swiglu_forward(h, y, rows, F); });
  }
  void swiglu_backward(const float* h, const float* dy, float* dh, int rows, int F) override {
    op("swiglu_backward", [=, this] { CpuDevice::swiglu_backward(h, dy, dh, rows, F); });
  }
  void swiglu_backward(const std::uint16_t* h, const float* dy, float* dh,
                       std::uint16_t* dh_bf16, int rows, int F) override {
    op("swiglu_backward",
       [=, this] { CpuDevice::swiglu_backward(h, dy, dh, dh_bf16, rows, F); });
  }

  void linear_forward(const LinearForward& f) override {
    op("linear_forward", [=, this] { CpuDevice::linear_forward(f); });
  }
  void linear_backward(const LinearBackward& b) override {
    op("linear_backward", [=, this] { CpuDevice::linear_backward(b); });
  }
  void to_bf16(const float* x, std::uint16_t* y, std::size_t n) override {
    op("to_bf16", [=, this] { CpuDevice::to_bf16(x, y, n); });
  }
  void from_bf16(const std::uint16_t* x, float* y, std::size_t n) override {
    op("from_bf16", [=, this] { CpuDevice::from_bf16(x, y, n); });
  }
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    op("gemm",
       [=, this] { CpuDevice::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  void gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    int lda, std::int64_t sa, const float* b, int ldb, std::int64_t sb,
                    float beta, float* c, int ldc, std::int64_t sc, int count) override {
    op("gemm_batched", [=, this] {
      CpuDevice::gemm_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                              count);
    });
  }
  void gemm_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                 const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float beta,
                 float* c, int ldc) override {
    op("gemm_bf16",
       [=, this] { CpuDevice::gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  void gemm_batched_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                         const std::uint16_t* a, int lda, std::int64_t sa,
                         const std::uint16_t* b, int ldb, std::int64_t sb, float beta, float* c,
                         int ldc, std::int64_t sc, int count) override {
    op("gemm_batched_bf16", [=, this] {
      CpuDevice::gemm_batched_bf16(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                                   sc, count);
    });
  }
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, float* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override {
    op("softmax_cross_entropy", [=, this] {
      CpuDevice::softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats,
                                       first_row);
    });
  }
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override {
    op("softmax_cross_entropy", [=, this] {
      CpuDevice::softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats,
                                       first_row);
    });
  }
  void softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override {
    op("softmax_cross_entropy", [=, this] {
      CpuDevice::softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats,
                                       first_row);
    });
  }
  using Device::softmax_cross_entropy;
  void causal_softmax_forward(const float* s, float* p, int count, int T, float sc) override {
    op("causal_softmax_forward", [=, this] { CpuDevice::causal_softmax_forward(s, p, count, T, sc); });
  }
  void causal_softmax_backward(const float* p, const float* dp, float* ds, int count, int T,
                               float sc) override {
    op("causal_softmax_backward",
       [=, this] { CpuDevice::causal_softmax_backward(p, dp, ds, count, T, sc); });
  }
  void causal_softmax_forward(const float* s, std::uint16_t* p, int count, int T,
                              float sc) override {
    op("causal_softmax_forward", [=, this] { CpuDevice::causal_softmax_forward(s, p, count, T, sc); });
  }
  void causal_softmax_backward(const std::uint16_t* p, const float* dp, std::uint16_t* ds,
                               int count, int T, float sc) override {
    op("causal_softmax_backward",
       [=, this] { CpuDevice::causal_softmax_backward(p, dp, ds, count, T, sc); });
  }
  void attention_forward(const AttentionShape& shape, MatIn qkv, MatOut y, float* lse) override {
    op("attention_forward", [=, this] { CpuDevice::attention_forward(shape, qkv, y, lse); });
  }
  void attention_backward(const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                          const float* lse, float* dqkv) override {
    op("attention_backward",
       [=, this] { CpuDevice::attention_backward(shape, qkv, y, dy, lse, dqkv); });
  }
  void sum_squares_grains(const float* x, std::size_t n, std::size_t grain,
                          double* out) override {
    op("sum_squares_grains", [=, this] { CpuDevice::sum_squares_grains(x, n, grain, out); });
  }
  void step_control(const double* sums, std::size_t grains, double clip_norm,
                    StepControl* control) override {
    op("step_control", [=, this] { CpuDevice::step_control(sums, grains, clip_norm, control); });
  }
  void sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                float* momentum_buf, std::size_t n, const StepControl* control,
                std::uint16_t* params_bf16) override {
    op("sgd_step", [=, this] {
      CpuDevice::sgd_step(opt, lr, params, grads, momentum_buf, n, control, params_bf16);
    });
  }
  void adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                  const float* grads, float* m, float* v, std::size_t n,
                  const StepControl* control, std::uint16_t* params_bf16) override {
    op("adamw_step", [=, this] {
      CpuDevice::adamw_step(opt, lr, t, params, grads, m, v, n, control, params_bf16);
    });
  }
  void embedding_forward(const float* ids, const float* wte, const float* wpe, float* out,
                         int batch, int T, int C, const std::int32_t* positions) override {
    op("embedding_forward",
       [=, this] { CpuDevice::embedding_forward(ids, wte, wpe, out, batch, T, C, positions); });
  }
  void embedding_backward(const float* ids, const float* dout, float* dwte, float* dwpe,
                          int batch, int T, int C, const std::int32_t* positions) override {
    op("embedding_backward", [=, this] {
      CpuDevice::embedding_backward(ids, dout, dwte, dwpe, batch, T, C, positions);
    });
  }
  void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                         float* rstd, int rows, int C) override {
    op("layernorm_forward",
       [=, this] { CpuDevice::layernorm_forward(x, w, b, y, mean, rstd, rows, C); });
  }
  void layernorm_forward(const float* x, const float* w, const float* b, std::uint16_t* y,
                         float* mean, float* rstd, int rows, int C) override {
    op("layernorm_forward",
       [=, this] { CpuDevice::layernorm_forward(x, w, b, y, mean, rstd, rows, C); });
  }
  void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd,
                          const float* dy, float* dx, float* dw, float* db, int rows,
                          int C) override {
    op("layernorm_backward",
       [=, this] { CpuDevice::layernorm_backward(x, w, mean, rstd, dy, dx, dw, db, rows, C); });
  }
  void residual_layernorm_forward(const float* a, const float* b, float* sum, const float* w,
                                  const float* bias, float* y, float* mean, float* rstd,
                                  int rows, int C) override {
    op("residual_layernorm_forward", [=, this] {
      CpuDevice::residual_layernorm_forward(a, b, sum, w, bias, y, mean, rstd, rows, C);
    });
  }
  void residual_layernorm_forward(const float* a, const float* b, float* sum, const float* w,
                                  const float* bias, std::uint16_t* y, float* mean, float* rstd,
                                  int rows, int C) override {
    op("residual_layernorm_forward", [=, this] {
      CpuDevice::residual_layernorm_forward(a, b, sum, w, bias, y, mean, rstd, rows, C);
    });
  }
  void residual_layernorm_backward(const float* x, const float* w, const float* mean,
                                   const float* rstd, const float* dy, const float* dresidual,
                                   float* dx, std::uint16_t* dx_bf16, float* dw, float* db,
                                   int rows, int C) override {
    op("residual_layernorm_backward", [=, this] {
      CpuDevice::residual_layernorm_backward(x, w, mean, rstd, dy, dresidual, dx, dx_bf16, dw,
                                             db, rows, C);
    });
  }  void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* w,
                                float* y, float* rstd, int rows, int C, float eps) override {
    op("residual_rmsnorm_forward", [=, this] {
      CpuDevice::residual_rmsnorm_forward(a, b, sum, w, y, rstd, rows, C, eps);
    });
  }
  void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* w,
                                std::uint16_t* y, float* rstd, int rows, int C,
                                float eps) override {
    op("residual_rmsnorm_forward", [=, this] {
      CpuDevice::residual_rmsnorm_forward(a, b, sum, w, y, rstd, rows, C, eps);
    });
  }
  void residual_rmsnorm_backward(const float* x, const float* w, const float* rstd,
                                 const float* dy, const float* dresidual, float* dx,
                                 std::uint16_t* dx_bf16, float* dw, int rows, int C) override {
    op("residual_rmsnorm_backward", [=, this] {
      CpuDevice::residual_rmsnorm_backward(x, w, rstd, dy, dresidual, dx, dx_bf16, dw, rows, C);
    });
  }
  void rope_forward(const RopeShape& shape, const RopeTable& table, float* qkv) override {
    op("rope_forward", [=, this] { CpuDevice::rope_forward(shape, table, qkv); });
  }
  void rope_forward(const RopeShape& shape, const RopeTable& table, std::uint16_t* qkv) override {
    op("rope_forward", [=, this] { CpuDevice::rope_forward(shape, table, qkv); });
  }
  void rope_backward(const RopeShape& shape, const RopeTable& table, float* dqkv,
                     std::uint16_t* dqkv_bf16) override {
    op("rope_backward",
       [=, this] { CpuDevice::rope_backward(shape, table, dqkv, dqkv_bf16); });
  }


 private:
  class Graph final : public DeviceGraph {
   public:
    Graph(GraphTestDevice& device, std::vector<std::function<void()>> ops)
        : device_(device), ops_(std::move(ops)), epoch_(device.epoch_) {}
    void launch() override {
      ++device_.counts_->launches;
      for (const auto& f : ops_) f();
    }
    bool valid() const noexcept override { return epoch_ == device_.epoch_; }

   private:
    GraphTestDevice& device_;
    std::vector<std::function<void()>> ops_;
    std::uint64_t epoch_;
  };

  void refused(const char* what) const {
    if (capturing_)
      throw std::runtime_error(fmt::format("{} cannot be captured (test device)", what));
  }
  template <class F>
  void op(const char* name, F f) {
    if (!capturing_) return f();
    if (refuse_ == name)
      throw std::runtime_error(fmt::format("{} cannot be captured (test device)", name));
    ops_.emplace_back(std::move(f));
    ++counts_->recorded;
  }

  std::string refuse_;
  std::shared_ptr<GraphCounts> counts_;
  bool capturing_ = false;
  std::vector<std::function<void()>> ops_;
  std::uint64_t epoch_ = 0;
};

// The CPU backend with GraphTestDevices. Named apart from "cpu", so that its workers start
// their collectives on the communication thread (Note [Inline collectives]) and backward cuts
// its graphs at buckets.
class GraphTestBackend final : public Backend {
 public:
  explicit GraphTestBackend(std::string refuse = {}) : refuse_(std::move(refuse)) {}
  std::string_view name() const noexcept override { return "graph-test"; }
  std::vector<DeviceInfo> devices() const override { return cpu_->devices(); }
  std::vector<std::unique_ptr<Communicator>> create_communicators(
      std::span<const int> ids, std::shared_ptr<ProcessGroup> processes) override {
    return cpu_->create_communicators(ids, std::move(processes));
  }
  bool rebuilds_communicators(std::span<const int> ids) const noexcept override {
    return cpu_->rebuilds_communicators(ids);
  }
  std::unique_ptr<Device> create_device(int id, int workers, int threads) override {
    return std::make_unique<GraphTestDevice>(id, cpu_threads_per_device(workers, threads),
                                             refuse_, counts);
  }

  const std::shared_ptr<GraphCounts> counts = std::make_shared<GraphCounts>();

 private:
  std::string refuse_;
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
};

}  // namespace lockstep::test
