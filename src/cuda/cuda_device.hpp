// The CUDA device: one GPU as seen by one worker thread.
//
//   auto device = std::make_unique<lockstep::cuda::CudaDevice>(0);  // on the worker's thread
//   cudaStream_t s = device->stream();                             // to order other work after it
//
// The constructor makes `id` the calling thread's current device; use the object on that thread
// (the destructor may run on any thread). Every kernel runs on one non-blocking compute stream;
// cuBLAS is bound to it. Calls that return a value to the host (copy_to_host, sum_squares,
// hash), synchronize, allocate and deallocate wait for the stream, polling so that an abort ends
// the wait (Note [Abortable waits] in lockstep/device.hpp), and count as host syncs (Note [Host
// syncs] in device.hpp), as does growing a workspace that reserve_workspace did not size; the
// rest only enqueues. The loss, the grain sums and the step's control stay in device memory.
// copy_to_device copies the host data into pinned staging memory before it returns, so the
// caller may reuse its buffer at once, and the transfer itself is queued on the stream;
// copy_to_host comes back through the same pinned memory, so that its wait polls too. A
// HostReadback (the step record's, Note [Deferred reads]) copies into its own pinned memory on
// the compute stream and waits for its own event only.
// Staged buffers (the trainer's next batch, cuda_staged_buffer.hpp) copy through their own
// pinned memory on the device's copy stream, so the transfer overlaps the kernels already queued.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "cuda/cublaslt.hpp"
#include "cuda/cudnn_attention.hpp"
#include "cuda/handles.hpp"
#include "cuda/kernels.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cuda {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int id);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string_view backend() const noexcept override { return "cuda"; }
  int id() const noexcept override { return id_; }

  // The compute stream: every kernel of this device runs on it.
  cudaStream_t stream() const noexcept { return stream_.get(); }
  // The same stream, for the communicator that joins this device to the others.
  DeviceQueue queue() const noexcept override { return {backend(), id_, stream_.get()}; }
  // TF32 tensor cores for gemm (faster, about 10 mantissa bits). Off by default.
  void set_tf32(bool enabled);

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  std::unique_ptr<StagedBuffer> make_staged_buffer(std::size_t bytes) override;
  std::unique_ptr<Download> make_download() override;
  HostMemory allocate_host(std::size_t bytes) override;
  std::unique_ptr<HostReadback> make_host_readback(std::size_t bytes) override;
  void synchronize() override;
  void reserve_workspace(int rows, int columns) override;
  void mark_step(bool end) override;
  std::optional<double> device_step_seconds() override;
  // Note [Device graphs]: stream capture of the compute stream, in this thread's mode.
  std::string graphs_unsupported() const override { return {}; }
  void begin_capture() override;
  std::unique_ptr<DeviceGraph> end_capture() override;
  void abort_capture() noexcept override;

  void fill(float* x, float value, std::size_t n) override;
  void scale(float* x, float alpha, std::size_t n) override;
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override;
  // Fully connected maps: one cuBLASLt matmul each, fused (Note [Fused linear]).
  void linear_forward(const LinearForward& f) override;
  void linear_backward(const LinearBackward& b) override;
  void add_bias(float* y, const float* bias, int rows, int cols) override;
  void bias_grad(float* dbias, const float* dy, int rows, int cols) override;
  void bias_grad(float* dbias, const std::uint16_t* dy, int rows, int cols) override;
  void activation_forward(Activation f, const float* x, float* y, std::size_t n) override;
  void activation_backward(Activation f, const float* x, const float* dy, float* dx,
                           std::size_t n) override;
  void add_bias(const float* x, const std::uint16_t* bias, std::uint16_t* y, int rows,
                int cols) override;
  void activation_forward(Activation f, const std::uint16_t* x, std::uint16_t* y,
                          std::size_t n) override;
  void activation_backward(Activation f, const std::uint16_t* x, const float* dy, float* dx,
                           std::uint16_t* dx_bf16, std::size_t n) override;
  void swiglu_forward(const float* h, float* y, int rows, int F) override;
  void swiglu_forward(const std::uint16_t* h, std::uint16_t* y, int rows, int F) override;
  void swiglu_backward(const float* h, const float* dy, float* dh, int rows, int F) override;
  void swiglu_backward(const std::uint16_t* h, const float* dy, float* dh,
                       std::uint16_t* dh_bf16, int rows, int F) override;
  void to_bf16(const float* x, std::uint16_t* y, std::size_t n) override;
  void from_bf16(const std::uint16_t* x, float* y, std::size_t n) override;
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, float* dlogits, float grad_scale, LossStats* stats,
                             int first_row) override;
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override;
  void softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats, int first_row) override;
  using Device::softmax_cross_entropy;
  double sum_squares(const float* x, std::size_t n) override;
  void sum_squares_grains(const float* x, std::size_t n, std::size_t grain,
                          double* out) override;
  void step_control(const double* grain_sums, std::size_t grains, double clip_norm,
                    StepControl* control) override;
  std::uint64_t hash(const float* x, std::size_t n) override;
  void sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                float* momentum_buf, std::size_t n, const StepControl* control,
                std::uint16_t* params_bf16) override;
  void adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                  const float* grads, float* m, float* v, std::size_t n,
                  const StepControl* control, std::uint16_t* params_bf16) override;

  void add(const float* a, const float* b, float* y, std::size_t n) override;
  void dropout(const float* x, float* y, std::size_t n, std::uint64_t key, float p,
               bool accumulate) override;
  void gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    int lda, std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b,
                    float beta, float* c, int ldc, std::int64_t stride_c, int count) override;
  void gemm_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                 const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float beta,
                 float* c, int ldc) override;
  void gemm_batched_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                         const std::uint16_t* a, int lda, std::int64_t stride_a,
                         const std::uint16_t* b, int ldb, std::int64_t stride_b, float beta,
                         float* c, int ldc, std::int64_t stride_c, int count) override;
  void embedding_forward(const float* ids, const float* wte, const float* wpe, float* out,
                         int batch, int T, int C, const std::int32_t* positions) override;
  void embedding_forward(const float* ids, const std::uint16_t* wte, const std::uint16_t* wpe,
                         float* out, int batch, int T, int C,
                         const std::int32_t* positions) override;
  void embedding_backward(const float* ids, const float* dout, float* dwte, float* dwpe,
                          int batch, int T, int C, const std::int32_t* positions) override;
  void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                         float* mean, float* rstd, int rows, int C) override;
  void layernorm_backward(const float* x, const float* weight, const float* mean,
                          const float* rstd, const float* dy, float* dx, float* dweight,
                          float* dbias, int rows, int C) override;
  void causal_softmax_forward(const float* s, float* p, int count, int T, float scale) override;
  void causal_softmax_tail_forward(const float* s, float* p, int count, int rows, int cols,
                                   float scale) override;
  void causal_softmax_backward(const float* p, const float* dp, float* ds, int count, int T,
                               float scale) override;
  void mask_packed_scores(float* s, const std::int32_t* positions, int batch, int heads,
                          int T) override;
  void layernorm_forward(const float* x, const float* weight, const float* bias,
                         std::uint16_t* y, float* mean, float* rstd, int rows, int C) override;
  void residual_layernorm_forward(const float* a, const float* b, float* sum,
                                  const float* weight, const float* bias, float* y, float* mean,
                                  float* rstd, int rows, int C) override;
  void residual_layernorm_forward(const float* a, const float* b, float* sum,
                                  const float* weight, const float* bias, std::uint16_t* y,
                                  float* mean, float* rstd, int rows, int C) override;
  void residual_layernorm_backward(const float* x, const float* weight, const float* mean,
                                   const float* rstd, const float* dy, const float* dresidual,
                                   float* dx, std::uint16_t* dx_bf16, float* dweight,
                                   float* dbias, int rows, int C) override;
  void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* weight,
                                float* y, float* rstd, int rows, int C, float eps) override;
  void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* weight,
                                std::uint16_t* y, float* rstd, int rows, int C,
                                float eps) override;
  void residual_rmsnorm_backward(const float* x, const float* weight, const float* rstd,
                                 const float* dy, const float* dresidual, float* dx,
                                 std::uint16_t* dx_bf16, float* dweight, int rows,
                                 int C) override;
  void rope_forward(const RopeShape& shape, const RopeTable& table, float* qkv) override;
  void rope_forward(const RopeShape& shape, const RopeTable& table, std::uint16_t* qkv) override;
  void rope_backward(const RopeShape& shape, const RopeTable& table, float* dqkv,
                     std::uint16_t* dqkv_bf16) override;
  void causal_softmax_forward(const float* s, std::uint16_t* p, int count, int T,
                              float scale) override;
  void causal_softmax_backward(const std::uint16_t* p, const float* dp, std::uint16_t* ds,
                               int count, int T, float scale) override;
  // cuDNN's fused attention, bf16 only (Note [cuDNN attention] in cudnn_attention.hpp); in a
  // build without it (LOCKSTEP_HAVE_CUDNN_ATTENTION unset) model.attention never picks it and a
  // call throws std::logic_error.
  void attention_forward(const AttentionShape& shape, MatIn qkv, MatOut y, float* lse) override;
  void attention_backward(const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                          const float* lse, float* dqkv) override;

 private:
  // Copies the first sizeof(T) bytes of result_ to the host, after the stream's work.
  template <class T>
  T read_result();
  // Returns once the compute stream's work is done (Note [Abortable waits]).
  void wait_for_stream();
  void abandon() noexcept;
  // Throws, naming `op`, when the stream is capturing a graph: before anything is queued or
  // recorded (Note [Device graphs] in lockstep/device.hpp).
  void refuse_capture(const char* op, const char* why);
  // Per-row scratch of softmax_cross_entropy, grown to at least `rows`.
  void reserve_rows(int rows);
  // The cuDNN handle and graphs of the fused attention, made on first use.
  CudnnAttention& cudnn_attention();
  // scratch_, grown to at least `bytes`: the working memory of one kernel at a time (the
  // kernels that use it are ordered on our stream).
  void* scratch(std::size_t bytes);

  class Graph;
  int id_;
  Stream stream_;
  CublasHandle cublas_;
  // Made once our device is current; none under LOCKSTEP_CUDA_LINEAR=composed.
  std::optional<LtLinear> lt_;
  // Fused attention's cuDNN handle (bound to stream_) and cached graphs; made on first use.
  CudnnAttentionPtr cudnn_attention_{nullptr, nullptr};
  // Its backward's algorithm (LOCKSTEP_CUDNN_BACKWARD, read when the device is made).
  bool cudnn_deterministic_ = true;
  DeviceMemory partials_;     // kReduceBlocks doubles: pass 1 of sum_squares
  DeviceMemory result_;       // one reduction result (a double or a 64-bit hash)
  PinnedMemory host_result_;  // its host mirror
  DeviceMemory row_loss_;     // row_capacity_ doubles
  DeviceMemory row_correct_;  // row_capacity_ + 1 ints
  int row_capacity_ = 0;
  DeviceMemory scratch_;  // scratch_bytes_: embedding_backward's sort, LayerNorm's partials
  std::size_t scratch_bytes_ = 0;
  // copy_to_device's and copy_to_host's two pinned chunks of kStagingChunk bytes, each with an
  // event recorded after its last transfer: a chunk is reused once that transfer is done.
  PinnedMemory staging_;
  Event staging_done_[2];
  int next_chunk_ = 0;
  // The staged buffers' transfers, beside the compute stream.
  Stream copy_stream_;
  // Note [Device step time]: the begin and end marks of the last two steps, and which were
  // made; mark_step(false) moves to the other pair, so that the older step's time can still be
  // read once the next step is queued (Note [Deferred reads]).
  struct StepMarks {
    Event begin, end;
    bool begun = false, ended = false;
  };
  StepMarks step_marks_[2];
  int step_pair_ = 0;
  // Note [Device graphs]: bumped whenever memory that captured kernels may use is replaced
  // (scratch(), reserve_rows()): a graph captured before is no longer valid(). The products
  // counted when the capture in progress began.
  std::uint64_t memory_epoch_ = 0;
  LinearCounts counts_at_capture_;
  class Readback;
};

}  // namespace lockstep::cuda
