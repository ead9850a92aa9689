// The CUDA device. See cuda_device.hpp for its threading and ordering rules, and src/cuda/ops for
// the arithmetic (which follows the CPU device's).
#include "cuda/cuda_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <memory>

#include <fmt/format.h>

#include "common/gemm_shape.hpp"
#include "common/linear.hpp"
#include "cuda/check.hpp"
#include "cuda/cuda_download.hpp"
#include "cuda/cuda_staged_buffer.hpp"
#include "cuda/nvtx.hpp"
#include "cuda/stream_work.hpp"

namespace lockstep::cuda {
namespace {

constexpr std::size_t kMinAllocation = 256;  // bytes; cudaMalloc's own alignment
constexpr std::size_t kStagingChunk = std::size_t{4} << 20;  // bytes; copy_to_device's chunks

ActivationKind kind_of(Activation f) {
  switch (f) {
    case Activation::relu: return ActivationKind::relu;
    case Activation::gelu: return ActivationKind::gelu;
    case Activation::tanh: return ActivationKind::tanh;
  }
  throw std::invalid_argument("activation: unknown activation");
}

cublasOperation_t op_of(Transpose t) { return t == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// op(A) (m, k), op(B) (k, n), C (m, n), row-major with leading dimensions.
using detail::check_gemm_shape;

// A kernel's sizes, by name: none negative, and its rows (B * T, or count * T) within the
// kernels' int row indices.
void check_sizes(const char* kernel, std::int64_t rows,
                 std::initializer_list<std::pair<const char*, int>> sizes) {
  bool negative = false;
  for (const auto& [name, size] : sizes) negative = negative || size < 0;
  if (!negative && rows <= std::numeric_limits<int>::max()) return;  // every call: no formatting
  std::string shape;
  for (const auto& [name, size] : sizes) shape += fmt::format(" {}={}", name, size);
  throw std::invalid_argument(fmt::format("{}: bad shape{}", kernel, shape));
}

// The kernels write lockstep's device records through their mirrors in kernels.hpp.
static_assert(sizeof(LossAccumulator) == sizeof(LossStats) &&
              offsetof(LossAccumulator, correct) == offsetof(LossStats, correct) &&
              offsetof(LossAccumulator, label_error) == offsetof(LossStats, label_error));
static_assert(sizeof(StepControlValues) == sizeof(StepControl) &&
              offsetof(StepControlValues, clip_scale) == offsetof(StepControl, clip_scale) &&
              offsetof(StepControlValues, skip) == offsetof(StepControl, skip));

const StepControlValues* values_of(const StepControl* control) {
  return reinterpret_cast<const StepControlValues*>(control);
}

// LOCKSTEP_CUDA_LINEAR: how the linear layers run (Note [Fused linear]), to measure what each
// fusion saves. fused (the default): every epilogue; bias: the bias and bias-gradient epilogues
// only, GELU and its backward as kernels; composed: plain kernels, no cuBLASLt.
enum class LinearMode { fused, bias, composed };
LinearMode linear_mode() {
  const char* env = std::getenv("LOCKSTEP_CUDA_LINEAR");
  const std::string_view asked = env ? env : "fused";
  if (asked == "fused") return LinearMode::fused;
  if (asked == "bias") return LinearMode::bias;
  if (asked == "composed") return LinearMode::composed;
  throw InputError(fmt::format(
      "LOCKSTEP_CUDA_LINEAR: expected fused, bias or composed, got '{}'", asked));
}

}  // namespace

CudaDevice::CudaDevice(int id) : id_(id) {
  CUDA_CHECK(cudaSetDevice(id));
  stream_ = make_stream();
  name_stream(stream_.get(), fmt::format("cuda:{} compute", id));
  cublas_ = make_cublas(stream_.get());
  CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));
  if (const LinearMode mode = linear_mode(); mode != LinearMode::composed)
    lt_.emplace(/*fuse_gelu=*/mode == LinearMode::fused);
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  cudnn_deterministic_ = cudnn_backward_deterministic_from_env();
#endif
  partials_ = make_device_memory(kReduceBlocks * sizeof(double));
  result_ = make_device_memory(sizeof(double));
  host_result_ = make_pinned_memory(sizeof(double));
  staging_ = make_pinned_memory(2 * kStagingChunk);
  for (Event& e : staging_done_) {
    e = make_event();
    CUDA_CHECK(cudaEventRecord(e.get(), stream()));  // recorded once, so always waitable
  }
  copy_stream_ = make_stream();
  name_stream(copy_stream_.get(), fmt::format("cuda:{} copy", id));
  for (StepMarks& m : step_marks_) {
    m.begin = make_timing_event();
    m.end = make_timing_event();
  }
}

CudaDevice::~CudaDevice() {
  // Possibly on another thread than ours, whose current device is another GPU: release
  // everything with our device current, newest first, once the queued work that uses it is done.
  DeviceGuard guard(id_);
  // After an abort, work may never finish (Note [Abortable waits]): then nothing is freed.
  if (!settle(stream_.get(), *this) || !settle(copy_stream_.get(), *this)) {
    abandon();
    return;
  }
  copy_stream_.reset();
  for (StepMarks& m : step_marks_) {
    m.end.reset();
    m.begin.reset();
  }
  for (Event& e : staging_done_) e.reset();
  staging_.reset();
  scratch_.reset();
  row_correct_.reset();
  row_loss_.reset();
  host_result_.reset();
  result_.reset();
  partials_.reset();
  lt_.reset();
  cudnn_attention_.reset();
  cublas_.reset();
  stream_.reset();
}

void CudaDevice::set_tf32(bool enabled) {
  if (lt_) lt_->set_tf32(enabled);
  CUBLAS_CHECK(cublasSetMathMode(cublas_.get(),
                                 enabled ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

// Note [Device step time] in device.hpp. Two pairs of marks: a step's time is still there
// while the next step is queued, for a read deferred past it (Note [Deferred reads]).
void CudaDevice::mark_step(bool end) {
  if (!end) step_pair_ = 1 - step_pair_;
  StepMarks& m = step_marks_[step_pair_];
  CUDA_CHECK(cudaEventRecord(end ? m.end.get() : m.begin.get(), stream()));
  if (end) {
    m.ended = true;
  } else {
    m.begun = true;
    m.ended = false;  // a begin starts a new pair
  }
}

std::optional<double> CudaDevice::device_step_seconds() {
  // The newest pair whose end is marked: the step being queued has none yet.
  for (const int pair : {step_pair_, 1 - step_pair_}) {
    const StepMarks& m = step_marks_[pair];
    if (!m.begun || !m.ended) continue;
    if (cudaEventQuery(m.end.get()) != cudaSuccess) {  // not done: never waited for
      (void)cudaGetLastError();  // a query's cudaErrorNotReady must not stick for a later check
      return std::nullopt;
    }
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, m.begin.get(), m.end.get()));
    return 1e-3 * ms;
  }
  return std::nullopt;
}

// ---- Memory -------------------------------------------------------------------------------------

void* CudaDevice::allocate(std::size_t bytes) {
  count_host_sync();
  const std::size_t size = std::max(bytes, kMinAllocation);
  void* p = nullptr;
  if (const cudaError_t status = cudaMalloc(&p, size); status != cudaSuccess) {
    (void)cudaGetLastError();
    // Out of memory says what the caller was allocating (Note [Naming an allocation]).
    if (status == cudaErrorMemoryAllocation) throw OutOfMemory::on_device(size, label());
    throw CudaError(fmt::format("{}: cannot allocate {} bytes: {}: {}", label(), bytes,
                                cudaGetErrorName(status), cudaGetErrorString(status)));
  }
  DeviceMemory owner(p);  // freed again if zeroing fails
  CUDA_CHECK(cudaMemsetAsync(p, 0, size, stream()));
  wait_for_stream();
  return owner.release();
}

void CudaDevice::deallocate(void* ptr) noexcept {
  if (!ptr) return;
  count_host_sync();
  DeviceGuard guard(id_);  // a DeviceArray may be destroyed on another thread
  // Kernels still queued may use the memory. Work on other streams that touched it (the
  // communicators') is already ordered before the compute stream's later work by events, or
  // drained (Communicator::drain). After an abort the memory is kept if the stream is busy.
  if (settle(stream(), *this)) (void)cudaFree(ptr);
}

// The host memory may be pageable, and the caller may reuse it as soon as we return. A plain
// cudaMemcpyAsync from pageable memory may wait for the whole stream (and a stream sync after it
// surely does), which would stall the host behind every queued kernel at each batch upload. So
// the bytes go through two pinned chunks in turn: we wait only until the chunk's previous
// transfer is done (long ago, in steady state), copy into it on the host, and queue the DMA.
void CudaDevice::copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  refuse_capture("copy_to_device",
                 "a copy from host memory goes through the pinned staging chunks, whose events "
                 "the host waits for");
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(host_src);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t len = std::min(kStagingChunk, bytes - done);
    const int k = next_chunk_;
    next_chunk_ = 1 - k;
    char* chunk = static_cast<char*>(staging_.get()) + static_cast<std::size_t>(k) * kStagingChunk;
    const cudaEvent_t chunk_done = staging_done_[k].get();
    wait_until([chunk_done] { return event_done(chunk_done); });
    std::memcpy(chunk, in + done, len);
    CUDA_CHECK(cudaMemcpyAsync(out + done, chunk, len, cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaEventRecord(staging_done_[k].get(), stream()));
    done += len;
  }
}

std::unique_ptr<StagedBuffer> CudaDevice::make_staged_buffer(std::size_t bytes) {
  return std::make_unique<CudaStagedBuffer>(*this, stream(), copy_stream_.get(), bytes);
}

std::unique_ptr<Download> CudaDevice::make_download() {
  return std::make_unique<CudaDownload>(*this, stream());
}

HostMemory CudaDevice::allocate_host(std::size_t bytes) {
  DeviceGuard guard(id_);
  return allocate_pinned(bytes);
}

// Note [Deferred reads] in device.hpp: the copy is queued on the compute stream into pinned
// memory of its own, and wait() polls the event recorded after it, not the stream, so kernels
// queued after start() do not delay it.
class CudaDevice::Readback final : public HostReadback {
 public:
  Readback(CudaDevice& device, std::size_t bytes)
      : device_(device), bytes_(bytes), host_(make_pinned_memory(std::max<std::size_t>(bytes, 1))),
        copied_(make_event()) {}
  ~Readback() override {
    // A copy may still write the pinned memory: free it once the stream is done, or keep it
    // after an abort with work still queued.
    DeviceGuard guard(device_.id());
    if (!settle(device_.stream(), device_)) (void)host_.release();
  }
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;

  std::size_t bytes() const noexcept override { return bytes_; }
  void start(const void* src) override {
    CUDA_CHECK(cudaMemcpyAsync(host_.get(), src, bytes_, cudaMemcpyDeviceToHost, device_.stream()));
    CUDA_CHECK(cudaEventRecord(copied_.get(), device_.stream()));
    started_ = true;
  }
  std::span<const std::byte> wait() override {
    if (!started_) throw std::logic_error("HostReadback::wait without start");
    device_.count_host_sync();
    const cudaEvent_t copied = copied_.get();
    device_.wait_until([copied] { return event_done(copied); });
    return {static_cast<const std::byte*>(host_.get()), bytes_};
  }

 private:
  CudaDevice& device_;
  std::size_t bytes_;
  PinnedMemory host_;
  Event copied_;
  bool started_ = false;
};

std::unique_ptr<HostReadback> CudaDevice::make_host_readback(std::size_t bytes) {
  return std::make_unique<Readback>(*this, bytes);
}

// A cudaMemcpyAsync into pageable memory returns only once the copy is done, so the host thread
// would wait inside CUDA, behind every kernel queued before it (a collective whose peer died
// among them), where no abort reaches it (Note [Abortable waits]). So the bytes come through
// the two pinned chunks, as copy_to_device's go: each chunk's copy is queued, its end recorded
// and polled with wait_until; while one chunk is on its way the other's bytes are copied out.
void CudaDevice::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  refuse_capture("copy_to_host", "a copy to host memory waits for the stream (a host sync)");
  if (bytes == 0) return;
  count_host_sync();
  auto* out = static_cast<char*>(host_dst);
  const auto* in = static_cast<const char*>(src);
  std::size_t pending_at[2] = {0, 0}, pending_len[2] = {0, 0};  // a chunk's bytes on their way
  // Waits for chunk k's last transfer (this read's copy into it, or an upload copy_to_device
  // queued from it), then copies out the bytes this read left there, if any.
  const auto collect = [&](int k) {
    const cudaEvent_t last = staging_done_[k].get();
    wait_until([last] { return event_done(last); });
    if (pending_len[k] == 0) return;
    std::memcpy(out + pending_at[k], static_cast<char*>(staging_.get()) + k * kStagingChunk,
                pending_len[k]);
    pending_len[k] = 0;
  };
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t len = std::min(kStagingChunk, bytes - done);
    const int k = next_chunk_;
    next_chunk_ = 1 - k;
    collect(k);
    char* chunk = static_cast<char*>(staging_.get()) + static_cast<std::size_t>(k) * kStagingChunk;
    CUDA_CHECK(cudaMemcpyAsync(chunk, in + done, len, cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaEventRecord(staging_done_[k].get(), stream()));
    pending_at[k] = done;
    pending_len[k] = len;
    done += len;
  }
  // The older chunk first: its copy was queued first.
  collect(next_chunk_);
  collect(1 - next_chunk_);
}

void CudaDevice::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void CudaDevice::synchronize() {
  count_host_sync();
  wait_for_stream();
}

void CudaDevice::wait_for_stream() {
  const cudaStream_t s = stream();
  wait_until([s] { return stream_idle(s); });
}

// Gives up every handle without freeing it: after an abort, with work still queued that may
// use any of them.
void CudaDevice::abandon() noexcept {
  for (DeviceMemory* m : {&scratch_, &row_correct_, &row_loss_, &result_, &partials_})
    (void)m->release();
  (void)staging_.release();
  (void)host_result_.release();
  for (Event& e : staging_done_) (void)e.release();
  if (lt_) lt_->abandon();
  (void)cudnn_attention_.release();  // its handle too: leaked with the rest
  (void)cublas_.release();
  (void)copy_stream_.release();
  (void)stream_.release();
}

// The loss's per-row scratch, and the scratch of embedding_backward and LayerNorm's backward
// for `rows` rows of at most `columns` channels.
void CudaDevice::reserve_workspace(int rows, int columns) {
  if (rows <= 0) return;
  reserve_rows(rows);
  scratch(std::max(embedding_backward_scratch_bytes(rows, 1),
                   layernorm_backward_scratch_bytes(rows, std::max(columns, 0))));
}

template <class T>
T CudaDevice::read_result() {
  static_assert(sizeof(T) <= sizeof(double));
  count_host_sync();
  CUDA_CHECK(cudaMemcpyAsync(host_result_.get(), result_.get(), sizeof(T), cudaMemcpyDeviceToHost,
                             stream()));
  wait_for_stream();
  T value;
  std::memcpy(&value, host_result_.get(), sizeof(T));
  return value;
}

void* CudaDevice::scratch(std::size_t bytes) {
  if (bytes > scratch_bytes_) {
    const std::size_t capacity = std::max(bytes, 2 * scratch_bytes_);
    count_host_sync();
    wait_for_stream();  // the old scratch may still be in use
    scratch_.reset();
    scratch_bytes_ = 0;
    scratch_ = make_device_memory(capacity);
    scratch_bytes_ = capacity;
    ++memory_epoch_;
  }
  return scratch_.get();
}

void CudaDevice::reserve_rows(int rows) {
  if (rows <= row_capacity_) return;
  const int capacity = std::max(rows, 2 * row_capacity_);
  count_host_sync();
  wait_for_stream();  // the old scratch may still be in use
  row_loss_ = make_device_memory(static_cast<std::size_t>(capacity) * sizeof(double));
  // One int more: the cross-entropy's bad-row flag (launch_softmax_cross_entropy).
  row_correct_ = make_device_memory((static_cast<std::size_t>(capacity) + 1) * sizeof(int));
  row_capacity_ = capacity;
  ++memory_epoch_;
}

// ---- Graphs (Note [Device graphs]) --------------------------------------------------------------

// An instantiated capture of the compute stream, launched there.
class CudaDevice::Graph final : public DeviceGraph {
 public:
  Graph(CudaDevice& device, cudaGraphExec_t exec, LinearCounts counts)
      : device_(device), exec_(exec), counts_(counts), epoch_(device.memory_epoch_) {}
  ~Graph() override {
    // A launch still in flight runs to its end; CUDA frees the graph after it.
    const DeviceGuard guard(device_.id_);
    (void)cudaGraphExecDestroy(exec_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void launch() override {
    CUDA_CHECK(cudaGraphLaunch(exec_, device_.stream()));
    device_.add_linear_counts(counts_);
  }
  bool valid() const noexcept override { return epoch_ == device_.memory_epoch_; }

 private:
  CudaDevice& device_;
  cudaGraphExec_t exec_;
  LinearCounts counts_;  // the products it runs, counted as it was captured
  std::uint64_t epoch_;
};

// Checked before the staging chunks' events are queried or recorded: recorded inside a capture,
// an event becomes a node of the graph, and the next copy's query of it fails.
void CudaDevice::refuse_capture(const char* op, const char* why) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream(), &status));
  if (status != cudaStreamCaptureStatusNone)
    throw std::runtime_error(fmt::format("{}: {} cannot be captured in a device graph: {} (Note "
                                         "[Device graphs])",
                                         label(), op, why));
}

// Thread-local mode: this thread may not call what is unsafe during a capture (an allocation, a
// synchronisation, a query of the stream), while the other workers' threads, capturing or not,
// go on as they were.
void CudaDevice::begin_capture() {
  CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  counts_at_capture_ = linear_counts();
}

std::unique_ptr<DeviceGraph> CudaDevice::end_capture() {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  const LinearCounts now = linear_counts();
  const LinearCounts counted{now.fused - counts_at_capture_.fused,
                             now.partial - counts_at_capture_.partial,
                             now.composed - counts_at_capture_.composed};
  // Counted at each launch instead: the ops have not run yet.
  reset_linear_counts(counts_at_capture_);
  struct DestroyGraph {
    void operator()(cudaGraph_t g) const noexcept { (void)cudaGraphDestroy(g); }
  };
  const std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, DestroyGraph> owned(graph);
  std::size_t nodes = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  if (nodes == 0) return nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  return std::make_unique<Graph>(*this, exec, counted);
}

void CudaDevice::abort_capture() noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream(), &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(stream(), &graph);  // invalidated, after a refused call
    if (graph) (void)cudaGraphDestroy(graph);
  }
  (void)cudaGetLastError();  // a refused call's error is not sticky: clear it
  reset_linear_counts(counts_at_capture_);
}

// ---- Elementwise --------------------------------------------------------------------------------

void CudaDevice::fill(float* x, float value, std::size_t n) { launch_fill(stream(), x, value, n); }

void CudaDevice::scale(float* x, float alpha, std::size_t n) {
  launch_scale(stream(), x, alpha, n);
}

// y (rows, cols) += bias (cols)
void CudaDevice::add_bias(float* y, const float* bias, int rows, int cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(fmt::format("add_bias: bad shape rows={} cols={}", rows, cols));
  launch_add_bias(stream(), y, bias, rows, cols);
}

void CudaDevice::activation_forward(Activation f, const float* x, float* y, std::size_t n) {
  launch_activation_forward(stream(), kind_of(f), x, y, n);
}

void CudaDevice::activation_backward(Activation f, const float* x, const float* dy, float* dx,
                                     std::size_t n) {
  launch_activation_backward(stream(), kind_of(f), x, dy, dx, n);
}

void CudaDevice::add_bias(const float* x, const std::uint16_t* bias, std::uint16_t* y, int rows,
                          int cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(fmt::format("add_bias: bad shape rows={} cols={}", rows, cols));
  launch_add_bias_bf16(stream(), x, bias, y, rows, cols);
}

void CudaDevice::activation_forward(Activation f, const std::uint16_t* x, std::uint16_t* y,
                                    std::size_t n) {
  launch_activation_forward_bf16(stream(), kind_of(f), x, y, n);
}

void CudaDevice::activation_backward(Activation f, const std::uint16_t* x, const float* dy,
                                     float* dx, std::uint16_t* dx_bf16, std::size_t n) {
  launch_activation_backward_bf16(stream(), kind_of(f), x, dy, dx, dx_bf16, n);
}

// Note [SwiGLU]: h (rows, 2F), gate then up; y (rows, F)
void CudaDevice::swiglu_forward(const float* h, float* y, int rows, int F) {
  check_sizes("swiglu_forward", rows, {{"rows", rows}, {"F", F}});
  launch_swiglu_forward(stream(), h, y, rows, F);
}

void CudaDevice::swiglu_forward(const std::uint16_t* h, std::uint16_t* y, int rows, int F) {
  check_sizes("swiglu_forward", rows, {{"rows", rows}, {"F", F}});
  launch_swiglu_forward_bf16(stream(), h, y, rows, F);
}

void CudaDevice::swiglu_backward(const float* h, const float* dy, float* dh, int rows, int F) {
  check_sizes("swiglu_backward", rows, {{"rows", rows}, {"F", F}});
  launch_swiglu_backward(stream(), h, dy, dh, rows, F);
}

void CudaDevice::swiglu_backward(const std::uint16_t* h, const float* dy, float* dh,
                                 std::uint16_t* dh_bf16, int rows, int F) {
  check_sizes("swiglu_backward", rows, {{"rows", rows}, {"F", F}});
  launch_swiglu_backward_bf16(stream(), h, dy, dh, dh_bf16, rows, F);
}

void CudaDevice::to_bf16(const float* x, std::uint16_t* y, std::size_t n) {
  launch_to_bf16(stream(), x, y, n);
}

void CudaDevice::from_bf16(const std::uint16_t* x, float* y, std::size_t n) {
  launch_from_bf16(stream(), x, y, n);
}

// ---- GEMM ---------------------------------------------------------------------------------------

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major. cuBLAS is
// column-major, and a row-major matrix is its transpose in column-major, so we ask cuBLAS for
// C^T (n, m) = op(B)^T (n, k) * op(A)^T (k, m): the same buffers and leading dimensions, with
// the operands swapped and the transposes kept.
void CudaDevice::gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c,
                      int ldc) {
  check_gemm_shape("gemm", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublasSgemm(cublas_.get(), op_of(tb), op_of(ta), n, m, k, &alpha, b, ldb, a, lda,
                           &beta, c, ldc));
}

// ---- Fully connected maps ----------------------------------------------------------------------

// Each product one cuBLASLt matmul with its epilogue. Where cuBLASLt refuses one, a forward
// with GELU runs the product with its bias fused and GELU as a kernel, an input gradient with
// GELU's backward fused and the bias gradient as a kernel; whatever is left runs as the
// composition of our other ops, which is what the CPU device computes (Note [Fused linear]).
// Each product is counted by how it ran (LinearCounts).
void CudaDevice::linear_forward(const LinearForward& f) {
  detail::check_linear(f);
  if (lt_ && lt_->forward(f, stream())) return count_linear(LinearPath::fused);
  if (lt_ && f.act == FusedActivation::gelu) {
    LinearForward sum = f;
    sum.act = FusedActivation::none, sum.pre = {}, sum.y = f.pre;
    if (lt_->forward(sum, stream())) {
      const std::size_t n = std::size_t(f.rows) * std::size_t(f.out);
      if (f.pre.bf16)
        activation_forward(Activation::gelu, f.pre.bf16, f.y.bf16, n);
      else
        activation_forward(Activation::gelu, f.pre.f32, f.y.f32, n);
      return count_linear(LinearPath::partial);
    }
  }
  detail::compose_linear_forward(*this, f);
  count_linear(LinearPath::composed);
}

void CudaDevice::linear_backward(const LinearBackward& b) {
  detail::check_linear(b);
  if (lt_ && lt_->weight_grad(b, stream())) {
    count_linear(LinearPath::fused);
  } else {
    detail::compose_weight_grad(*this, b);
    count_linear(LinearPath::composed);
  }
  if (!b.dx) return;
  if (lt_ && lt_->input_grad(b, stream())) return count_linear(LinearPath::fused);
  if (lt_ && b.dbias_pre && lt_->input_grad(b, stream(), /*bias_epilogue=*/false))
    return count_linear(LinearPath::partial);
  detail::compose_input_grad(*this, b);
  count_linear(LinearPath::composed);
}

// ---- Reductions ---------------------------------------------------------------------------------

// dbias (cols) += column sums of dy (rows, cols)
void CudaDevice::bias_grad(float* dbias, const float* dy, int rows, int cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(fmt::format("bias_grad: bad shape rows={} cols={}", rows, cols));
  launch_bias_grad(stream(), dbias, dy, rows, cols);
}

void CudaDevice::bias_grad(float* dbias, const std::uint16_t* dy, int rows, int cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(fmt::format("bias_grad: bad shape rows={} cols={}", rows, cols));
  launch_bias_grad_bf16(stream(), dbias, dy, rows, cols);
}

// logits (rows, classes), labels (rows), dlogits (rows, classes) or null.
void CudaDevice::softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                       int classes, float* dlogits, float grad_scale,
                                       LossStats* stats, int first_row) {
  detail::check_loss_shape(rows, classes);
  if (rows == 0) return;
  reserve_rows(rows);  // sized before the first step (reserve_workspace): no wait here
  launch_softmax_cross_entropy(stream(), logits, labels, rows, classes, dlogits, grad_scale,
                               static_cast<double*>(row_loss_.get()),
                               static_cast<int*>(row_correct_.get()),
                               reinterpret_cast<LossAccumulator*>(stats), first_row);
}

void CudaDevice::softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                       int classes, std::uint16_t* dlogits, float grad_scale,
                                       LossStats* stats, int first_row) {
  detail::check_loss_shape(rows, classes);
  if (rows == 0) return;
  reserve_rows(rows);
  launch_softmax_cross_entropy_bf16(stream(), logits, labels, rows, classes, dlogits, grad_scale,
                                    static_cast<double*>(row_loss_.get()),
                                    static_cast<int*>(row_correct_.get()),
                                    reinterpret_cast<LossAccumulator*>(stats), first_row);
}

void CudaDevice::softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels,
                                       int rows, int classes, std::uint16_t* dlogits,
                                       float grad_scale, LossStats* stats, int first_row) {
  detail::check_loss_shape(rows, classes);
  if (rows == 0) return;
  reserve_rows(rows);
  launch_fused_classifier(stream(), logits, labels, rows, classes, dlogits, grad_scale,
                          static_cast<double*>(row_loss_.get()),
                          static_cast<int*>(row_correct_.get()),
                          reinterpret_cast<LossAccumulator*>(stats), first_row);
}

double CudaDevice::sum_squares(const float* x, std::size_t n) {
  launch_sum_squares(stream(), x, n, static_cast<double*>(partials_.get()),
                     static_cast<double*>(result_.get()));
  return read_result<double>();
}

void CudaDevice::sum_squares_grains(const float* x, std::size_t n, std::size_t grain,
                                    double* out) {
  if (grain == 0) throw std::invalid_argument("sum_squares_grains: grain 0");
  if (n == 0) return;
  launch_sum_squares_grains(stream(), x, n, grain, out);
}

void CudaDevice::step_control(const double* grain_sums, std::size_t grains, double clip_norm,
                              StepControl* control) {
  launch_step_control(stream(), grain_sums, grains, clip_norm,
                      reinterpret_cast<StepControlValues*>(control));
}

// n + sum over i of mix64(bits(x[i]) ^ mix64(i)), mod 2^64: the CPU device's formula.
std::uint64_t CudaDevice::hash(const float* x, std::size_t n) {
  launch_hash(stream(), x, n, static_cast<unsigned long long*>(result_.get()));
  return n + static_cast<std::uint64_t>(read_result<unsigned long long>());
}

// ---- Optimisers ---------------------------------------------------------------------------------

void CudaDevice::sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                          float* momentum_buf, std::size_t n, const StepControl* control,
                          std::uint16_t* params_bf16) {
  if (opt.momentum != 0.0f && !momentum_buf)
    throw std::invalid_argument("sgd_step: momentum needs a momentum buffer");
  launch_sgd_step(stream(), lr, opt.momentum, opt.weight_decay, opt.nesterov, params, grads,
                  momentum_buf, n, values_of(control), params_bf16);
}

// The scalars exactly as the CPU device computes them: in double, rounded once to float.
void CudaDevice::adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                            const float* grads, float* m, float* v, std::size_t n,
                            const StepControl* control, std::uint16_t* params_bf16) {
  if (t < 1) throw std::invalid_argument(fmt::format("adamw_step: step {} < 1", t));
  const AdamWScalars s =
      detail::adamw_scalars(opt.beta1, opt.beta2, opt.eps, opt.weight_decay, lr, t);
  launch_adamw_step(stream(), s, params, grads, m, v, n, values_of(control), params_bf16);
}

// ---- Transformer kernels ------------------------------------------------------------------------

void CudaDevice::add(const float* a, const float* b, float* y, std::size_t n) {
  launch_add(stream(), a, b, y, n);
}

void CudaDevice::dropout(const float* x, float* y, std::size_t n, std::uint64_t key, float p,
                         bool accumulate) {
  launch_dropout(stream(), x, y, n, key, p, accumulate);
}

// As gemm(), count times: C_i = alpha * op(A_i) * op(B_i) + beta * C_i, each matrix swapped into
// cuBLAS's column-major view the same way, the strides unchanged.
void CudaDevice::gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                              const float* a, int lda, std::int64_t stride_a, const float* b,
                              int ldb, std::int64_t stride_b, float beta, float* c, int ldc,
                              std::int64_t stride_c, int count) {
  if (count < 0) throw std::invalid_argument(fmt::format("gemm_batched: count {} < 0", count));
  check_gemm_shape("gemm_batched", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0 || count == 0) return;
  CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_.get(), op_of(tb), op_of(ta), n, m, k, &alpha, b,
                                         ldb, stride_b, a, lda, stride_a, &beta, c, ldc, stride_c,
                                         count));
}

// As gemm() and gemm_batched(), with bf16 A and B: cuBLAS multiplies them exactly and sums in
// fp32 (CUBLAS_COMPUTE_32F) into the fp32 C, as the CPU device's products do (Note [bf16
// compute] in src/model/ops.hpp).
void CudaDevice::gemm_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                           const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb,
                           float beta, float* c, int ldc) {
  check_gemm_shape("gemm_bf16", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublasGemmEx(cublas_.get(), op_of(tb), op_of(ta), n, m, k, &alpha, b, CUDA_R_16BF,
                            ldb, a, CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, ldc,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaDevice::gemm_batched_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                                   const std::uint16_t* a, int lda, std::int64_t stride_a,
                                   const std::uint16_t* b, int ldb, std::int64_t stride_b,
                                   float beta, float* c, int ldc, std::int64_t stride_c,
                                   int count) {
  if (count < 0)
    throw std::invalid_argument(fmt::format("gemm_batched_bf16: count {} < 0", count));
  check_gemm_shape("gemm_batched_bf16", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0 || count == 0) return;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_.get(), op_of(tb), op_of(ta), n, m, k, &alpha, b, CUDA_R_16BF, ldb, stride_b, a,
      CUDA_R_16BF, lda, stride_a, &beta, c, CUDA_R_32F, ldc, stride_c, count, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

// ids (batch, T), wte (V, C), wpe (T_max, C), out (batch, T, C)
void CudaDevice::embedding_forward(const float* ids, const float* wte, const float* wpe,
                                   float* out, int batch, int T, int C,
                                   const std::int32_t* positions) {
  check_sizes("embedding_forward", std::int64_t{batch} * T,
              {{"batch", batch}, {"T", T}, {"C", C}});
  launch_embedding_forward(stream(), ids, wte, wpe, out, batch, T, C, positions);
}

void CudaDevice::embedding_forward(const float* ids, const std::uint16_t* wte,
                                   const std::uint16_t* wpe, float* out, int batch, int T, int C,
                                   const std::int32_t* positions) {
  check_sizes("embedding_forward", std::int64_t{batch} * T,
              {{"batch", batch}, {"T", T}, {"C", C}});
  launch_embedding_forward(stream(), ids, wte, wpe, out, batch, T, C, positions);
}

void CudaDevice::embedding_backward(const float* ids, const float* dout, float* dwte,
                                    float* dwpe, int batch, int T, int C,
                                    const std::int32_t* positions) {
  check_sizes("embedding_backward", std::int64_t{batch} * T,
              {{"batch", batch}, {"T", T}, {"C", C}});
  if (batch == 0 || T == 0 || C == 0) return;
  void* buffer = scratch(embedding_backward_scratch_bytes(batch, T));
  launch_embedding_backward(stream(), ids, dout, dwte, dwpe, batch, T, C, buffer,
                            scratch_bytes_, positions);
}

// x, y (rows, C), weight, bias (C), mean, rstd (rows)
void CudaDevice::layernorm_forward(const float* x, const float* weight, const float* bias,
                                   float* y, float* mean, float* rstd, int rows, int C) {
  residual_layernorm_forward(x, nullptr, nullptr, weight, bias, y, mean, rstd, rows, C);
}

void CudaDevice::layernorm_forward(const float* x, const float* weight, const float* bias,
                                   std::uint16_t* y, float* mean, float* rstd, int rows, int C) {
  residual_layernorm_forward(x, nullptr, nullptr, weight, bias, y, mean, rstd, rows, C);
}

// With b null: layernorm_forward of a (Note [Residual LayerNorm]).
void CudaDevice::residual_layernorm_forward(const float* a, const float* b, float* sum,
                                            const float* weight, const float* bias, float* y,
                                            float* mean, float* rstd, int rows, int C) {
  check_sizes("layernorm_forward", rows, {{"rows", rows}, {"C", C}});
  launch_layernorm_forward(stream(), a, b, sum, weight, bias, y, mean, rstd, rows, C);
}

void CudaDevice::residual_layernorm_forward(const float* a, const float* b, float* sum,
                                            const float* weight, const float* bias,
                                            std::uint16_t* y, float* mean, float* rstd, int rows,
                                            int C) {
  check_sizes("layernorm_forward", rows, {{"rows", rows}, {"C", C}});
  launch_layernorm_forward_bf16(stream(), a, b, sum, weight, bias, y, mean, rstd, rows, C);
}

void CudaDevice::layernorm_backward(const float* x, const float* weight, const float* mean,
                                    const float* rstd, const float* dy, float* dx,
                                    float* dweight, float* dbias, int rows, int C) {
  residual_layernorm_backward(x, weight, mean, rstd, dy, dx, dx, nullptr, dweight, dbias, rows,
                              C);
}

void CudaDevice::residual_layernorm_backward(const float* x, const float* weight,
                                             const float* mean, const float* rstd,
                                             const float* dy, const float* dresidual, float* dx,
                                             std::uint16_t* dx_bf16, float* dweight,
                                             float* dbias, int rows, int C) {
  check_sizes("layernorm_backward", rows, {{"rows", rows}, {"C", C}});
  if (rows == 0) return;
  launch_layernorm_backward(stream(), x, weight, mean, rstd, dy, dresidual, dx, dx_bf16, dweight,
                            dbias, rows, C, scratch(layernorm_backward_scratch_bytes(rows, C)));
}

// Note [RMSNorm]: x = a (+ b into sum), y (rows, C), weight (C), rstd (rows)
void CudaDevice::residual_rmsnorm_forward(const float* a, const float* b, float* sum,
                                          const float* weight, float* y, float* rstd, int rows,
                                          int C, float eps) {
  check_sizes("rmsnorm_forward", rows, {{"rows", rows}, {"C", C}});
  launch_rmsnorm_forward(stream(), a, b, sum, weight, y, rstd, rows, C, eps);
}

void CudaDevice::residual_rmsnorm_forward(const float* a, const float* b, float* sum,
                                          const float* weight, std::uint16_t* y, float* rstd,
                                          int rows, int C, float eps) {
  check_sizes("rmsnorm_forward", rows, {{"rows", rows}, {"C", C}});
  launch_rmsnorm_forward_bf16(stream(), a, b, sum, weight, y, rstd, rows, C, eps);
}

void CudaDevice::residual_rmsnorm_backward(const float* x, const float* weight,
                                           const float* rstd, const float* dy,
                                           const float* dresidual, float* dx,
                                           std::uint16_t* dx_bf16, float* dweight, int rows,
                                           int C) {
  check_sizes("rmsnorm_backward", rows, {{"rows", rows}, {"C", C}});
  if (rows == 0) return;
  launch_rmsnorm_backward(stream(), x, weight, rstd, dy, dresidual, dx, dx_bf16, dweight, rows,
                          C, scratch(layernorm_backward_scratch_bytes(rows, C)));
}

// Note [RoPE]: qkv (B T, (H + 2 Hkv) D), the tables (positions, D / 2)
void CudaDevice::rope_forward(const RopeShape& shape, const RopeTable& table, float* qkv) {
  detail::check_rope_shape("rope_forward", shape, table);
  check_sizes("rope_forward", std::int64_t{shape.batch} * shape.T, {});
  launch_rope_forward(stream(), qkv, table.cos, table.sin, shape.batch * shape.T, shape.T,
                      shape.position, shape.positions, shape.heads, shape.kv_heads, shape.head_size);
}

void CudaDevice::rope_forward(const RopeShape& shape, const RopeTable& table,
                              std::uint16_t* qkv) {
  detail::check_rope_shape("rope_forward", shape, table);
  check_sizes("rope_forward", std::int64_t{shape.batch} * shape.T, {});
  launch_rope_forward_bf16(stream(), qkv, table.cos, table.sin, shape.batch * shape.T, shape.T,
                           shape.position, shape.positions, shape.heads, shape.kv_heads, shape.head_size);
}

void CudaDevice::rope_backward(const RopeShape& shape, const RopeTable& table, float* dqkv,
                               std::uint16_t* dqkv_bf16) {
  detail::check_rope_shape("rope_backward", shape, table);
  check_sizes("rope_backward", std::int64_t{shape.batch} * shape.T, {});
  launch_rope_backward(stream(), dqkv, table.cos, table.sin, shape.batch * shape.T, shape.T,
                       shape.position, shape.positions, shape.heads, shape.kv_heads, shape.head_size, dqkv_bf16);
}

// `count` (T, T) matrices
void CudaDevice::causal_softmax_forward(const float* s, float* p, int count, int T, float scale) {
  check_sizes("causal_softmax_forward", std::int64_t{count} * T, {{"count", count}, {"T", T}});
  launch_causal_softmax_forward(stream(), s, p, count, T, scale);
}

void CudaDevice::causal_softmax_tail_forward(const float* s, float* p, int count, int rows,
                                             int cols, float scale) {
  check_sizes("causal_softmax_tail_forward", std::int64_t{count} * rows,
              {{"count", count}, {"rows", rows}, {"cols", cols}});
  if (rows > cols)
    throw std::invalid_argument(fmt::format(
        "causal_softmax_tail_forward: rows {} > cols {}", rows, cols));
  launch_causal_softmax_tail_forward(stream(), s, p, count, rows, cols, scale);
}

void CudaDevice::causal_softmax_backward(const float* p, const float* dp, float* ds, int count,
                                         int T, float scale) {
  check_sizes("causal_softmax_backward", std::int64_t{count} * T, {{"count", count}, {"T", T}});
  launch_causal_softmax_backward(stream(), p, dp, ds, count, T, scale);
}

void CudaDevice::mask_packed_scores(float* s, const std::int32_t* positions, int batch,
                                    int heads, int T) {
  check_sizes("mask_packed_scores", std::int64_t{batch} * heads * T,
              {{"batch", batch}, {"heads", heads}, {"T", T}});
  launch_mask_packed_scores(stream(), s, positions, batch, heads, T);
}

void CudaDevice::causal_softmax_forward(const float* s, std::uint16_t* p, int count, int T,
                                        float scale) {
  check_sizes("causal_softmax_forward", std::int64_t{count} * T, {{"count", count}, {"T", T}});
  launch_causal_softmax_forward_bf16(stream(), s, p, count, T, scale);
}

void CudaDevice::causal_softmax_backward(const std::uint16_t* p, const float* dp,
                                         std::uint16_t* ds, int count, int T, float scale) {
  check_sizes("causal_softmax_backward", std::int64_t{count} * T, {{"count", count}, {"T", T}});
  launch_causal_softmax_backward_bf16(stream(), p, dp, ds, count, T, scale);
}

#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
namespace {
// A shape cuDNN's rules refuse (T = 1: its backward's "s_q = s_kv = 1 is not supported") as a
// clear error before any graph is built; choose_attention resolves such a model to materialized.
void refuse_cudnn_shape(const char* op, const AttentionShape& shape) {
  const std::string why = cudnn_attention_refusal(Precision::bf16, shape.head_size, shape.T,
                                                  cudnn_runtime_version());
  if (!why.empty())
    throw std::invalid_argument(fmt::format(
        "cuda: {}: {} (model.attention resolves to materialized for such a model)", op, why));
}
}  // namespace
#endif

// Note [cuDNN attention] in cudnn_attention.hpp. The graphs are built and the working memory
// grown on the first call of a shape (the warm-up's, before step 1); later calls only enqueue.
// Backward's gradients come from cuDNN in bf16, into the front of the working memory, and are
// widened into dqkv as the interface has them (fp32): c_attn's backward then rounds them for its
// products, which gives the same bf16 values back (exact), at the cost of one more pass over
// (B T, (H + 2 Hkv) D).
void CudaDevice::attention_forward(const AttentionShape& shape, MatIn qkv, MatOut y, float* lse) {
  detail::check_attention_shape("attention_forward", shape);
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  if (!qkv.bf16 || !y.bf16)
    throw std::invalid_argument(
        "cuda: attention_forward: cuDNN's fused attention takes bf16 qkv and y "
        "(trainer.precision bf16; model.attention resolves to materialized otherwise)");
  if (shape.batch == 0) return;
  refuse_cudnn_shape("attention_forward", shape);
  CudnnAttention& attention = cudnn_attention();
  // Packed sequences: their mask first, then cuDNN's workspace (Note [cuDNN packed mask]).
  const std::size_t bias_bytes = packed_bias_bytes(shape);
  auto* base = static_cast<std::byte*>(
      scratch(bias_bytes + attention.workspace_bytes(shape, /*backward=*/false)));
  auto* bias = reinterpret_cast<std::uint16_t*>(base);
  if (shape.positions)
    launch_packed_attention_bias(stream(), bias, shape.positions, shape.batch, shape.T);
  attention.forward(shape, qkv.bf16, y.bf16, lse, base + bias_bytes,
                    shape.positions ? bias : nullptr);
#else
  (void)qkv, (void)y, (void)lse;
  throw std::logic_error("cuda: attention_forward: this build has no cuDNN fused attention; "
                         "model.attention resolves to materialized here");
#endif
}

void CudaDevice::attention_backward(const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                                    const float* lse, float* dqkv) {
  detail::check_attention_shape("attention_backward", shape);
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  if (!qkv.bf16 || !y.bf16 || !dy.bf16)
    throw std::invalid_argument(
        "cuda: attention_backward: cuDNN's fused attention takes bf16 qkv, y and dy "
        "(trainer.precision bf16; model.attention resolves to materialized otherwise)");
  if (shape.batch == 0) return;
  refuse_cudnn_shape("attention_backward", shape);
  const std::size_t n = std::size_t(shape.batch) * shape.T * qkv_width(shape);
  const std::size_t gradient_bytes = (n * sizeof(std::uint16_t) + 255) / 256 * 256;
  CudnnAttention& attention = cudnn_attention();
  // [packed sequences' mask | bf16 dqkv | cuDNN's workspace] (Note [cuDNN packed mask]).
  const std::size_t bias_bytes = packed_bias_bytes(shape);
  auto* base = static_cast<std::byte*>(scratch(
      bias_bytes + gradient_bytes + attention.workspace_bytes(shape, /*backward=*/true)));
  auto* bias = reinterpret_cast<std::uint16_t*>(base);
  if (shape.positions)
    launch_packed_attention_bias(stream(), bias, shape.positions, shape.batch, shape.T);
  auto* dqkv16 = reinterpret_cast<std::uint16_t*>(base + bias_bytes);
  attention.backward(shape, qkv.bf16, y.bf16, dy.bf16, lse, dqkv16,
                     base + bias_bytes + gradient_bytes, shape.positions ? bias : nullptr);
  launch_from_bf16(stream(), dqkv16, dqkv, n);
#else
  (void)qkv, (void)y, (void)dy, (void)lse, (void)dqkv;
  throw std::logic_error("cuda: attention_backward: this build has no cuDNN fused attention; "
                         "model.attention resolves to materialized here");
#endif
}

#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
CudnnAttention& CudaDevice::cudnn_attention() {
  if (!cudnn_attention_)
    cudnn_attention_ = {new CudnnAttention(stream(), cudnn_deterministic_),
                        [](CudnnAttention* a) { delete a; }};
  return *cudnn_attention_;
}
#endif

}  // namespace lockstep::cuda
