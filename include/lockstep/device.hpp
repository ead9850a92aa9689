// Devices and backends.
//
// A Device is one worker's compute engine: its memory, its queue (a CUDA stream, or the
// calling thread on the CPU) and the kernels the model and optimiser need. Pointers passed to
// the kernels come from allocate() on the same device. Kernels are ordered on the device's
// queue; calls that return values to the host (copy_to_host, sum_squares, hash) wait for the
// queue, and every device counts them (Note [Host syncs]). The operations come in small
// interfaces by group (memory, BLAS, fully connected maps, elementwise, layer, attention,
// reduction and optimiser ops), which Device joins; Note [Adding a device op] says where a new
// one goes.
//
// A Backend makes devices and the communicators that join them:
//
//   auto backend = lockstep::make_backend(lockstep::BackendKind::cpu);
//   auto comms = backend->create_communicators(ids);   // on the host thread, before workers
//   // in worker thread r:
//   auto device = backend->create_device(ids[r], ids.size(), /*threads_per_device=*/0);
//   comms[r]->attach(*device);                         // orders collectives on its queue
//
// All matrices are row-major. Shapes are given in comments as (rows, cols).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "lockstep/error.hpp"
#include "lockstep/export.hpp"
#include "lockstep/types.hpp"

// The CUDA runtime's stream type (cudaStream_t is CUstream_st*), so that DeviceQueue can carry a
// stream without this header including CUDA's.
struct CUstream_st;

namespace lockstep {

class Communicator;
class ProcessGroup;

enum class Transpose { no, yes };

// What softmax_cross_entropy adds up, in device memory: zeroed, then added to by every call of
// a step (or of an eval), then read once. Standard layout: src/cuda/kernels.hpp mirrors it.
struct LOCKSTEP_API LossStats {
  double loss_sum = 0.0;     // summed over the rows, not averaged
  std::int64_t correct = 0;  // rows whose argmax equals the label
  // 0 when every label lay inside [0, classes); otherwise the lowest row of a call with a label
  // outside it, and that label, packed by detail::label_error_key (src/common/
  // elementwise_math.hpp; the largest key is the lowest row). The sums are then not to be used.
  std::uint64_t label_error = 0;
};

// The optimiser step's scalars, in device memory: computed on the device from the gradient's
// norm (ReductionOps::step_control) and read by the update kernels, so the host queues the
// update without waiting for the norm (Note [One read per step] in src/train/step_record.hpp).
// Standard layout: src/cuda/kernels.hpp mirrors it.
struct LOCKSTEP_API StepControl {
  double grad_norm = 0.0;   // of the averaged gradient
  float clip_scale = 1.0f;  // the update uses grads * clip_scale
  std::int32_t skip = 0;    // nonzero: the norm is not finite; the update changes nothing
};

struct LOCKSTEP_API SgdParams {
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

struct LOCKSTEP_API AdamWParams {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// A device buffer filled from the host while the device works on something else: double
// buffering, one batch ahead. Made by Device::make_staged_buffer; used on the device's thread.
//
//   std::unique_ptr<StagedBuffer> x = device.make_staged_buffer(bytes);
//   x->stage(std::as_bytes(std::span(host)));  // starts the copy; `host` may be reused at once
//   ...                                        // kernels on the other batch
//   x->wait();                                 // kernels queued from here on see the copy
//   device.scale(x->data<float>(), 2.0f, n);
//
// stage() never overwrites the buffer under a reader: its copy starts after every kernel queued
// before the call, and every reader of the previous contents was queued before it.
class LOCKSTEP_API StagedBuffer {
 public:
  virtual ~StagedBuffer() = default;
  virtual std::size_t bytes() const noexcept = 0;
  // Starts copying `host` (at most bytes()) to the start of the buffer; returns once `host` may
  // be reused. The copy may overlap kernels already queued.
  virtual void stage(std::span<const std::byte> host) = 0;
  // Orders every kernel queued after this call after the last stage()'s copy.
  virtual void wait() = 0;
  template <class T>
  T* data() noexcept {
    return static_cast<T*>(device_pointer());
  }

 protected:
  virtual void* device_pointer() noexcept = 0;
};

// Note [Downloads]
//   A copy of device memory to the host that the host does not wait for: the mirror of a
//   StagedBuffer. A GPU's runs on a stream of its own, into pinned memory (Device::
//   allocate_host), while the kernels queued after it run; only the kernels that would overwrite
//   what it copies must wait for it, and they wait on the device (fence), never the host.
//     std::unique_ptr<Download> d = device.make_download();
//     d->start(copies);        // after every kernel queued so far; returns at once
//     ...                      // kernels that only read the copied memory overlap the copies
//     d->fence();              // kernels queued from here on run after the copies
//     device.adamw_step(...);  // may overwrite the copied memory
//     if (d->done()) ...;      // polls; wait() waits
//   A device whose operations finish before they return (the CPU) copies in start().
//   In-memory snapshots (Note [Snapshots] in src/train/snapshot.hpp) are its user.

// One copy of a Download: `bytes` of device memory at `device` to host memory at `host`.
struct LOCKSTEP_API Transfer {
  void* host = nullptr;
  const void* device = nullptr;
  std::size_t bytes = 0;
};

// Made by Device::make_download; used on the device's thread. See Note [Downloads].
class LOCKSTEP_API Download {
 public:
  virtual ~Download() = default;
  // Starts `copies`, ordered after every kernel queued so far, and returns. The host memory must
  // stay alive, and the previous start's copies must be done (done()).
  virtual void start(std::span<const Transfer> copies) = 0;
  // Orders every kernel queued after this call after the last start()'s copies.
  virtual void fence() = 0;
  // Whether the last start()'s copies have landed in host memory (true before any start). Never
  // waits.
  virtual bool done() = 0;
  // Returns once done(); throws CommAborted if the group is aborted first (Note [Abortable
  // waits]). Flow control, not a host sync (Note [Host syncs]): it waits for copies started
  // steps ago, not for the kernels just queued.
  virtual void wait() = 0;
};

// Host memory a Download may copy into; freed when its last owner lets go, which may be after
// the device that made it is gone.
using HostMemory = std::shared_ptr<std::byte[]>;

// Note [Deferred reads]
// A few bytes of device memory read by the host later than they were written: the copy is
// queued behind the work queued so far, and the host collects it after queuing more, waiting
// for that copy alone, not for the work queued after it. The trainer reads each step's record
// this way while the next step's forward is already queued (Note [One read per step] in
// src/train/step_record.hpp). Made by Device::make_host_readback; used on the device's thread.
//
//   std::unique_ptr<HostReadback> r = device.make_host_readback(bytes);
//   r->start(record);                          // queued: copies record once earlier work is done
//   ...                                        // more kernels queued
//   std::span<const std::byte> h = r->wait();  // a host sync (Note [Host syncs])
//
// The default copies in wait() (copy_to_host), on a device whose work is done before its calls
// return: the source must then hold the same bytes from start() to wait(), as the trainer's two
// step records do. A GPU copies in start() through pinned memory and wait() polls its event.
class LOCKSTEP_API HostReadback {
 public:
  virtual ~HostReadback() = default;
  virtual std::size_t bytes() const noexcept = 0;
  // Queues the copy of bytes() from `src` (device memory); returns at once.
  virtual void start(const void* src) = 0;
  // Waits for the last start()'s copy (abortable, Note [Abortable waits]) and returns it; valid
  // until the next start().
  virtual std::span<const std::byte> wait() = 0;
};

// Note [Device graphs]
//   A GPU pays for each kernel launch on its host: a GPT-2 step is over a thousand, whose
//   enqueue becomes the step's floor once the kernels are fast. A device graph records a run of
//   ops once and replays it with one launch:
//
//     device.begin_capture();            // from here ops are recorded, not run
//     replica.forward(x, batch);         // the same calls as ever
//     std::unique_ptr<DeviceGraph> g = device.end_capture();
//     g->launch();                       // runs them; again each step, on new data in x
//
//   Its semantics are CUDA's stream capture, whatever the backend:
//   - nothing runs during the capture; each launch runs the recorded ops, queued after the work
//     queued before it;
//   - each op's arguments are frozen at capture: its pointers and its host values (a size, a
//     scale, a learning rate). What changes between launches must be in device memory that the
//     captured ops read;
//   - a host sync (Note [Host syncs]), an allocation and a copy from or to host memory
//     (copy_to_device, copy_to_host) cannot be captured: they throw before they queue or record
//     anything (on CUDA, once cudaStreamIsCapturing says so; the copies' pinned staging events
//     are never recorded into a graph), and abort_capture() then drops the capture, leaving the
//     device as it was before begin_capture(), no op of the capture run.
//   A graph stays valid() until the device replaces memory its ops use without being told (a
//   workspace grown since); the caller then captures again. Destroy graphs before their device.
//   The CPU backend has none (graphs_unsupported()): its ops run on the calling thread, so
//   there is no launch to save. The trainer's use: Note [Step graphs] in
//   src/train/step_graphs.hpp.
class LOCKSTEP_API DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Queues the recorded ops once more.
  virtual void launch() = 0;
  virtual bool valid() const noexcept { return true; }
};

// Where a device's work is ordered, as a communicator needs it to order its collectives with
// the worker's kernels (Communicator::bind). A CPU device's queue is the calling thread.
struct LOCKSTEP_API DeviceQueue {
  std::string_view backend;            // "cpu", "cuda"
  int device_id = 0;
  CUstream_st* cuda_stream = nullptr;  // CUDA: the compute stream every kernel runs on
};

// The Device's operations, one interface per group. Device derives from all of them, so callers
// write device.gemm(...) as before; a backend implements them together in one class.
//
// Note [Adding a device op]
//   An op touches four places, and its CPU version is the reference:
//   1. its declaration, with shapes and semantics, in the interface of its group below;
//   2. its CPU version in src/cpu/ops/<family>.cpp, called by the CpuDevice override: plain
//      loops that every other backend is tested against. Per-element math that both backends
//      compute goes in src/common/elementwise_math.hpp (__host__ __device__), written once;
//   3. its CUDA kernel and launcher (taking the worker's stream, checking the launch) in
//      src/cuda/ops/<family>.cu, called by the CudaDevice override;
//   4. a test of the CPU version (a closed form, or finite differences) in tests/cpu/, and one
//      of the GPU against the CPU on fresh random inputs in tests/cuda/.
//   When the two backends disagree, the CUDA kernel is wrong: the CPU version defines the op.
//   A new group is a new interface here, added to Device's bases.

// Note [Host syncs]
//   A GPU runs ahead of its host only while the host never waits for it. The calls that wait
//   (or, on a GPU, would) are the host syncs: copy_to_host, synchronize, the reductions that
//   return a value (sum_squares, hash), and allocate and deallocate (cudaMalloc and cudaFree
//   wait for the device). Every backend counts them at this API boundary, each in its own
//   override, so a test on the CPU device proves what the trainer asks of a GPU
//   (host_syncs_per_step in the summary). Flow control is not counted: copy_to_device and a
//   StagedBuffer may wait for their own transfer of a batch or two ago, never for the kernels
//   just queued.

// Memory and the queue. allocate() returns zeroed memory aligned for any element type.
class LOCKSTEP_API MemoryOps {
 public:
  virtual void* allocate(std::size_t bytes) = 0;           // a host sync
  virtual void deallocate(void* ptr) noexcept = 0;         // a host sync
  virtual void copy_to_device(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;  // waits
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;  // device to device

  // Waits until every operation queued so far has finished.
  virtual void synchronize() = 0;

  // Sizes the kernels' working memory for up to `rows` rows (the loss's rows, B x T) of up to
  // `columns` channels or classes, so that no kernel of a step allocates (Note [Host syncs]).
  // The default has none to size.
  virtual void reserve_workspace(int /*rows*/, int /*columns*/) {}

  // Host syncs so far (Note [Host syncs]). Any thread may read it.
  std::uint64_t host_syncs() const noexcept { return host_syncs_.load(std::memory_order_relaxed); }

  // Note [Device step time]
  //   mark_step(false) and mark_step(true) mark where a step's work begins and ends in the
  //   device's queue; once a host sync has waited for the end, device_step_seconds() is the
  //   device time between the two marks (on a GPU, CUDA events): the step as the device lived
  //   it, waits for the host inside it included; once the next step's begin is marked too (a
  //   read deferred past it, Note [Deferred reads]), still the step whose end is marked. Set
  //   against the host's time from one step's start to the next, it says how long the device
  //   sat idle between steps, waiting for its host (device_busy in the summary). nullopt where
  //   the device runs on its host's thread
  //   (the CPU, whose work is the host's own time) or before both marks completed. Neither call
  //   waits or counts as a host sync.
  virtual void mark_step(bool /*end*/) {}
  virtual std::optional<double> device_step_seconds() { return std::nullopt; }

 protected:
  void count_host_sync() noexcept { host_syncs_.fetch_add(1, std::memory_order_relaxed); }
  ~MemoryOps() = default;

 private:
  // Atomic: a DeviceArray may be freed on another thread than the device's.
  std::atomic<std::uint64_t> host_syncs_{0};
};

// Matrix products (BLAS sgemm, cuBLAS).
class LOCKSTEP_API BlasOps {
 public:
  // C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, row-major with leading dims.
  virtual void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;
  // Strided batched GEMM: for i in [0, count), C_i = alpha * op(A_i) * op(B_i) + beta * C_i with
  // A_i = a + i * stride_a (likewise B_i, C_i); otherwise as gemm().
  virtual void gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                            const float* a, int lda, std::int64_t stride_a, const float* b,
                            int ldb, std::int64_t stride_b, float beta, float* c, int ldc,
                            std::int64_t stride_c, int count) = 0;
  // As gemm() and gemm_batched() with A and B in bf16 (the bits, Note [Rounding to bf16] in
  // src/common/bf16.hpp) and C in fp32: each product of two bf16 values is exact in fp32, and
  // the sums accumulate in fp32 (Note [bf16 compute] in src/model/ops.hpp).
  virtual void gemm_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                         const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb,
                         float beta, float* c, int ldc) = 0;
  virtual void gemm_batched_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                                 const std::uint16_t* a, int lda, std::int64_t stride_a,
                                 const std::uint16_t* b, int ldb, std::int64_t stride_b,
                                 float beta, float* c, int ldc, std::int64_t stride_c,
                                 int count) = 0;

 protected:
  ~BlasOps() = default;
};

// A matrix operand in either storage: fp32 values, or bf16 bits (Note [Rounding to bf16] in
// src/common/bf16.hpp). At most one pointer is set; `+` moves into the matrix by elements.
struct LOCKSTEP_API MatIn {
  const float* f32 = nullptr;
  const std::uint16_t* bf16 = nullptr;
  friend MatIn operator+(MatIn m, std::int64_t i) {
    return {m.f32 ? m.f32 + i : nullptr, m.bf16 ? m.bf16 + i : nullptr};
  }
};
struct LOCKSTEP_API MatOut {
  float* f32 = nullptr;
  std::uint16_t* bf16 = nullptr;
  MatIn input() const { return {f32, bf16}; }
};

// The activation a fully connected map's products fuse (LinearOps).
enum class FusedActivation { none, gelu };

// A fully connected map on rows, y = act(x weight^T + bias), shapes as torch.nn.Linear: x (rows,
// in), weight (out, in), bias (out), y (rows, out). Operands read by the products (x, weight)
// share a storage.
struct LOCKSTEP_API LinearForward {
  int rows = 0, in = 0, out = 0;
  MatIn x{}, weight{};
  // In y's storage: fp32 with an fp32 y, bf16 with a bf16 y (the bias's copy in the bf16
  // weights, Note [bf16 compute]): cuBLASLt's bias epilogue reads the bias in the output's type.
  MatIn bias{};
  FusedActivation act = FusedActivation::none;
  MatOut pre{};                           // act gelu: (rows, out), in y's storage; else unset
  MatOut y{};                             // (rows, out)
  float* product = nullptr;               // y in bf16: fp32 (rows, out) working memory
};

// Its backward, and with act gelu that of the GELU before it (x = gelu(pre)):
//   dweight (out, in) += g^T x;  dbias (out) += column sums of dy (skipped when null);
//   dx (rows, in) = g weight (skipped when null); with act gelu
//   dx = (g weight) * gelu'(pre), the gradient of pre, whose column sums dbias_pre (in; when
//   set) accumulates: the bias gradient of the map that made pre. With bf16 weights dx_bf16
//   (when set) receives dx rounded to bf16, the next products' input, and dx is then working
//   memory (Note [Fused linear]).
// g is dy as the products read it: dy itself, or dy rounded to bf16 (with bf16 weights).
struct LOCKSTEP_API LinearBackward {
  int rows = 0, in = 0, out = 0;
  MatIn x{}, weight{};
  const float* dy = nullptr;              // (rows, out) fp32: the bias gradient's input
  MatIn g{};                              // (rows, out)
  float* dweight = nullptr;
  float* dbias = nullptr;
  float* dx = nullptr;
  FusedActivation act = FusedActivation::none;
  MatIn pre{};                            // act gelu: (rows, in) as the forward kept it
  std::uint16_t* dx_bf16 = nullptr;       // bf16 weights: (rows, in)
  float* dbias_pre = nullptr;             // act gelu: (in)
};

// Note [Fused linear]
// ~~~~~~~~~~~~~~~~~~~
// A linear layer is one op, not gemm + add_bias + activation, so that a backend can fuse the
// elementwise neighbours of a product into its epilogue and save their passes over memory.
// The CPU defines the op as that composition of Device ops (src/common/linear.hpp): the
// rounding points of Note [bf16 compute], bit for bit what the layers computed before. The
// CUDA device runs each product as one cuBLASLt matmul (src/cuda/cublaslt.cpp):
//   forward: EPILOGUE_BIAS, or GELU_AUX_BIAS writing y and keeping pre (the aux matrix), which
//     saves the bias pass (and in bf16 the fp32 product's round trip) and the GELU pass. The
//     bias is in D's type, as cuBLASLt documents CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE outside
//     FP8 and IMMA kernels: a bf16 y adds the bias's bf16 copy (from the bf16 weights the
//     optimiser writes, no pass of its own), and the CPU adds the same widened bf16 bias;
//   dweight: the product with beta 1, and BGRADB summing g into dbias: no read of dy for it;
//   dx: the product, with act gelu DGELU_BGRAD reading pre (aux) and summing dbias_pre, which
//     saves GELU's backward pass and the next map's bias-gradient read; in bf16 it writes the
//     gradient rounded only, with no fp32 copy, and its bias gradient in D's type too (bf16).
// Where cuBLASLt refuses a problem, the call runs partly fused: a forward with GELU as the bias
// epilogue and a GELU kernel; a dx with DGELU_BGRAD as DGELU and the bias_grad kernel over the
// gradient it wrote (bf16 when rounded). What is left runs as the composition of the other ops.
// Only CUBLAS_STATUS_NOT_SUPPORTED and a heuristic that finds no algorithm are refusals (an aux
// leading dimension not a multiple of 8, a type mix or alignment without a kernel); any other
// status throws with the call and the problem, so a bug in a descriptor cannot pass for a
// missing kernel. Each product counts as fused, partial or composed (LinearCounts; fused_linear
// in the run's summary), and each refusal is reported once on stderr with its shape and reason.
// A problem's descriptor, layouts and algorithm (or refusal) are cached by its shape, types,
// epilogue and alignments (src/cuda/cublaslt.hpp): none is created in a step after the warm-up.
// LOCKSTEP_CUDA_LINEAR=bias keeps GELU and its backward out of the epilogues, composed keeps
// cuBLASLt out: llm.c leaves its GELU fusion off by default, finding cuBLASLt's fused GELU slow
// on some GPUs, so scripts/gpu_extra_linear.sh times all three.
// Fused, CUDA computes differently from the CPU in these places, so its tests compare within
// 1e-4 of the largest value (fp32; 1e-3 with GELU) or a bf16 neighbour (bf16), not bit for bit:
//   - GELU: cuBLASLt's own. Its documentation gives no formula; we take it to be the tanh
//     approximation, as ours (hipBLASLt documents tanh), computed its own way. In the forward
//     it is applied to the fp32 pre-activation before pre is rounded to bf16, where the CPU
//     applies it to the rounded pre (Note [bf16 compute]); in the backward both read pre as
//     kept.
//   - dbias with bf16 weights: BGRADB sums g, the bf16-rounded dy, where the CPU sums the fp32
//     dy (each term off by at most 2^-9 relative). dbias_pre with a rounded dx: DGELU_BGRAD
//     rounds its column sums to bf16 (2^-9 relative), and the partly fused form sums the
//     rounded gradient, where the CPU sums the fp32 gradient of pre before it is rounded.
//   - Summation orders, of the products (as for gemm) and of the bias gradients.
// The epilogues write bias gradients into a device buffer, which a short pass of `out` elements
// then adds to dbias (+=). An input gradient with dx_bf16 set, fused (with or without GELU's
// backward), writes only dx_bf16, straight from the epilogue: dx is then working memory whose
// contents afterwards are not to be read (the CPU leaves the fp32 gradient there), and the map
// before a GELU gets its bias gradient from dbias_pre, not from dy.

// How a device ran its linear maps' products (Note [Fused linear]): each product, a forward,
// a weight gradient or an input gradient, counts once.
struct LOCKSTEP_API LinearCounts {
  std::uint64_t fused = 0;     // one library call, every elementwise neighbour in its epilogue
  std::uint64_t partial = 0;   // an epilogue for some neighbours, kernels for the rest
  std::uint64_t composed = 0;  // plain ops only: the CPU's definition, a GPU's fallback
  std::uint64_t total() const noexcept { return fused + partial + composed; }
  LinearCounts& operator+=(const LinearCounts& o) noexcept {
    fused += o.fused, partial += o.partial, composed += o.composed;
    return *this;
  }
};

// Fully connected maps with their bias, activation and bias gradients (Note [Fused linear]).
class LOCKSTEP_API LinearOps {
 public:
  virtual void linear_forward(const LinearForward& f) = 0;
  virtual void linear_backward(const LinearBackward& b) = 0;

  // The products so far, by how they ran; read on the device's thread.
  LinearCounts linear_counts() const noexcept { return linear_counts_; }

 protected:
  enum class LinearPath { fused, partial, composed };
  void count_linear(LinearPath path) noexcept {
    ++(path == LinearPath::fused     ? linear_counts_.fused
       : path == LinearPath::partial ? linear_counts_.partial
                                     : linear_counts_.composed);
  }
  // A device graph's products: counted at its capture, added at each launch; dropped with an
  // aborted capture (Note [Device graphs]).
  void add_linear_counts(const LinearCounts& c) noexcept { linear_counts_ += c; }
  void reset_linear_counts(const LinearCounts& c) noexcept { linear_counts_ = c; }
  ~LinearOps() = default;

 private:
  LinearCounts linear_counts_;
};

// Elementwise and broadcast arithmetic, activations included.
class LOCKSTEP_API ElementwiseOps {
 public:
  // x[0..n) = value
  virtual void fill(float* x, float value, std::size_t n) = 0;
  // x[0..n) *= alpha
  virtual void scale(float* x, float alpha, std::size_t n) = 0;
  // y = a + b, elementwise over n; y may alias a or b.
  virtual void add(const float* a, const float* b, float* y, std::size_t n) = 0;
  // Dropout by a counter-based mask (Note [LoRA dropout] in src/model/lora.cpp): over n
  // elements, y[i] = x[i] / (1 - p) where dropout_keeps(key, i, p) (common/elementwise_math.hpp)
  // and 0 elsewhere; accumulate: y[i] += that instead. The mask is a function of (key, i, p)
  // alone, the same bits on every backend. p in [0, 1); y may alias x unless accumulating.
  virtual void dropout(const float* x, float* y, std::size_t n, std::uint64_t key, float p,
                       bool accumulate) = 0;
  // y (rows, cols) += bias (cols), broadcast over rows
  virtual void add_bias(float* y, const float* bias, int rows, int cols) = 0;
  // dbias (cols) += column sums of dy (rows, cols)
  virtual void bias_grad(float* dbias, const float* dy, int rows, int cols) = 0;
  // y = f(x), elementwise over n
  virtual void activation_forward(Activation f, const float* x, float* y, std::size_t n) = 0;
  // dx = dy * f'(x), elementwise over n (x is the activation's input)
  virtual void activation_backward(Activation f, const float* x, const float* dy, float* dx,
                                   std::size_t n) = 0;
  // y[0..n) = x rounded to bf16, to nearest even, as bits (Note [Rounding to bf16] in
  // src/common/bf16.hpp); from_bf16 widens them back, exactly.
  virtual void to_bf16(const float* x, std::uint16_t* y, std::size_t n) = 0;
  virtual void from_bf16(const std::uint16_t* x, float* y, std::size_t n) = 0;

  // bf16 storage (Note [bf16 compute] in src/model/ops.hpp). Each overload below computes what
  // its fp32 form computes, reading its bf16 operands widened and writing its bf16 results
  // rounded (to nearest even, as to_bf16): bit for bit the fp32 op between from_bf16 and
  // to_bf16 passes, without those passes.
  // y (rows, cols) = x (rows, cols) + bias (cols), rounded to bf16; the bias in bf16, as a
  // bf16 output's bias epilogue reads it (LinearForward::bias).
  virtual void add_bias(const float* x, const std::uint16_t* bias, std::uint16_t* y, int rows,
                        int cols) = 0;
  // dbias (cols) += column sums of dy (rows, cols) with dy bf16, summed in fp32 or wider: the
  // bias gradient of a gradient kept only rounded (a fused GELU backward's, Note [Fused
  // linear]).
  virtual void bias_grad(float* dbias, const std::uint16_t* dy, int rows, int cols) = 0;
  // y = f(x), x and y bf16.
  virtual void activation_forward(Activation f, const std::uint16_t* x, std::uint16_t* y,
                                  std::size_t n) = 0;
  // dx = dy * f'(x) with x bf16; when dx_bf16 is not null it also receives dx rounded to bf16
  // (a matrix product's input). dx may alias dy.
  virtual void activation_backward(Activation f, const std::uint16_t* x, const float* dy,
                                   float* dx, std::uint16_t* dx_bf16, std::size_t n) = 0;

  // SwiGLU, the gated MLP activation of Llama-family decoders (Note [SwiGLU] in
  // src/cpu/ops/elementwise.cpp): h (rows, 2F) holds gate (columns [0, F)) and up ([F, 2F))
  // side by side, as one product with the gate and up weights stacked writes them; y (rows, F)
  // = silu(gate) * up. h and y fp32, or both bf16 (widened as read, rounded as written).
  virtual void swiglu_forward(const float* h, float* y, int rows, int F) = 0;
  virtual void swiglu_forward(const std::uint16_t* h, std::uint16_t* y, int rows, int F) = 0;
  // dh (rows, 2F), overwritten, in h's layout: dgate = dy * up * silu'(gate), dup = dy *
  // silu(gate), from dy (rows, F). With h bf16, dh_bf16 (rows, 2F), when not null, receives dh
  // rounded (the gate/up product's input). dh aliases neither h nor dy.
  virtual void swiglu_backward(const float* h, const float* dy, float* dh, int rows, int F) = 0;
  virtual void swiglu_backward(const std::uint16_t* h, const float* dy, float* dh,
                               std::uint16_t* dh_bf16, int rows, int F) = 0;

 protected:
  ~ElementwiseOps() = default;
};

// Rotary position embeddings over B sequences of T positions of a qkv buffer (B T, (H + 2 Hkv)
// D): the q block of H heads, then the k and v blocks of Hkv heads each (grouped-query
// attention's layout; Hkv = H without it), head h at columns h D of its block. Row t of each
// sequence is at position `position` + t (a key/value cache's offset when generating).
struct LOCKSTEP_API RopeShape {
  int batch = 0, T = 0, heads = 0, kv_heads = 0, head_size = 0;
  int position = 0;
  // Packed sequences: (B, T) int32 in device memory, row t's position (replacing position + t).
  const std::int32_t* positions = nullptr;
};

// The cos and sin of every position's angles, each (positions, D / 2) in device memory, made
// once per run (src/model/rope.hpp): row p, column i holds the cos (sin) of p * inv_freq[i].
struct LOCKSTEP_API RopeTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int positions = 0;
};

// The layers' own kernels: the loss, GPT's embedding, LayerNorm and attention softmax, and a
// Llama-family decoder's RMSNorm and rotary embeddings.
// B sequences of T positions, C channels, V vocabulary entries. Backward kernels accumulate
// into parameter gradients (+=), as layers do.
class LOCKSTEP_API LayerOps {
 public:
  // logits (rows, classes), labels (rows). Adds the rows' summed loss and correct count to
  // *stats (device memory) without waiting; a label outside [0, classes) is recorded in
  // stats->label_error instead of throwing, and the call's sums and dlogits are then not to be
  // used (the CPU leaves both alone). If dlogits is not null it receives
  // (softmax(logits) - onehot(label)) * grad_scale. first_row: the batch's row of logits' row
  // 0, for a caller that passes its rows a chunk at a time (Note [Chunked classifier] in
  // src/model/lm_head.cpp): a bad label is recorded as of row first_row + r, so that
  // label_error names (and, over several calls, picks the lowest of) the batch's rows.
  virtual void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                     int classes, float* dlogits, float grad_scale,
                                     LossStats* stats, int first_row) = 0;
  // The same with dlogits (not null) rounded to bf16 as it is written, bit for bit to_bf16 of
  // the fp32 dlogits: the gradient a bf16 LM head reads (Note [bf16 compute] in
  // src/model/ops.hpp), without the fp32 copy.
  virtual void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                     int classes, std::uint16_t* dlogits, float grad_scale,
                                     LossStats* stats, int first_row) = 0;
  // The fused classifier (Note [Fused classifier] in src/cpu/ops/softmax.cpp): the same with
  // bf16 logits, as a bf16 LM head writes them, widened as read; the loss and softmax in fp32
  // or wider row by row, so no fp32 copy of the logits exists. dlogits (bf16, or null) may be
  // the logits themselves: each row's gradient then overwrites the row.
  virtual void softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels,
                                     int rows, int classes, std::uint16_t* dlogits,
                                     float grad_scale, LossStats* stats, int first_row) = 0;
  // The three above for a whole batch (first_row 0).
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, float* dlogits, float grad_scale, LossStats* stats) {
    softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats, 0);
  }
  void softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats) {
    softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats, 0);
  }
  void softmax_cross_entropy(const std::uint16_t* logits, const std::int32_t* labels, int rows,
                             int classes, std::uint16_t* dlogits, float grad_scale,
                             LossStats* stats) {
    softmax_cross_entropy(logits, labels, rows, classes, dlogits, grad_scale, stats, 0);
  }
  // ids (B, T) token ids stored as floats (exact below 2^24), wte (V, C), wpe (T_max, C):
  // out (B, T, C) = wte[ids[b, t]] + wpe[p] with p = t, or positions[b, t] for packed
  // sequences ((B, T) int32, each below T_max; Note [Packed attention] in
  // src/model/attention.hpp); wpe null: wte[ids[b, t]] (a decoder with rotary positions has no
  // position embedding).
  virtual void embedding_forward(const float* ids, const float* wte, const float* wpe, float* out,
                                 int batch, int T, int C, const std::int32_t* positions) = 0;
  // The same from bf16 tables (a frozen embedding held in bf16 only, Note [Frozen parameters]
  // in src/model/lora.cpp): out = widened wte[ids[b, t]] + widened wpe[p], summed in fp32, so
  // exactly the fp32 op on the widened tables; wpe null: wte[ids[b, t]] widened.
  virtual void embedding_forward(const float* ids, const std::uint16_t* wte,
                                 const std::uint16_t* wpe, float* out, int batch, int T, int C,
                                 const std::int32_t* positions) = 0;
  // dwte[ids[b, t]] += dout[b, t]; dwpe[p] += dout[b, t] with p as forward's (skipped when
  // null). Each row of dwte and dwpe adds its rows in (b, t) order.
  virtual void embedding_backward(const float* ids, const float* dout, float* dwte, float* dwpe,
                                  int batch, int T, int C, const std::int32_t* positions) = 0;
  // x, y (rows, C); weight, bias (C): y = (x - mean) * rstd * weight + bias with rstd =
  // 1 / sqrt(var + 1e-5) (biased variance, as torch.nn.LayerNorm). mean, rstd (rows) are saved
  // for backward.
  virtual void layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                                 float* mean, float* rstd, int rows, int C) = 0;
  // dx (rows, C) += d/dx; dweight, dbias (C) += their gradients. Note dx is accumulated too:
  // a LayerNorm sits on a residual stream whose gradient is already there.
  virtual void layernorm_backward(const float* x, const float* weight, const float* mean,
                                  const float* rstd, const float* dy, float* dx, float* dweight,
                                  float* dbias, int rows, int C) = 0;
  // For each of `count` (T, T) score matrices s: p[i][j] = softmax over j' <= i of
  // scale * s[i][j'], and 0 for j > i (causal mask). p may alias s.
  virtual void causal_softmax_forward(const float* s, float* p, int count, int T, float scale) = 0;
  // The same for the newest `rows` positions of sequences of `cols` (queries against a
  // key/value cache, Note [KV cache] in src/model/kv_cache.cpp): `count` (rows, cols) score
  // matrices whose row i is position cols - rows + i and sees columns j <= cols - rows + i.
  // rows = cols = T is causal_softmax_forward, bit for bit. p may alias s.
  virtual void causal_softmax_tail_forward(const float* s, float* p, int count, int rows,
                                           int cols, float scale) = 0;
  // ds[i][j] = scale * p[i][j] * (dp[i][j] - sum over j' <= i of p[i][j'] dp[i][j']), 0 for
  // j > i. ds may alias dp.
  virtual void causal_softmax_backward(const float* p, const float* dp, float* ds, int count,
                                       int T, float scale) = 0;
  // Packed sequences (Note [Packed attention] in src/model/attention.hpp): in the (B, H, T, T)
  // score matrices s, s[b][h][i][j] = -inf for every key j < i - positions[b][i], a key of an
  // earlier sequence, which the causal softmax then gives no weight (and so no gradient).
  virtual void mask_packed_scores(float* s, const std::int32_t* positions, int batch, int heads,
                                  int T) = 0;

  // bf16 storage, as ElementwiseOps' overloads: the fp32 op with its bf16 operands widened as
  // read and its bf16 results rounded as written, bit for bit. LayerNorm's y (a matrix
  // product's only input) rounded; the attention probabilities p rounded; backward reading p
  // in bf16 and writing ds rounded only (the products are its only readers).
  virtual void layernorm_forward(const float* x, const float* weight, const float* bias,
                                 std::uint16_t* y, float* mean, float* rstd, int rows,
                                 int C) = 0;
  virtual void causal_softmax_forward(const float* s, std::uint16_t* p, int count, int T,
                                      float scale) = 0;
  virtual void causal_softmax_backward(const std::uint16_t* p, const float* dp,
                                       std::uint16_t* ds, int count, int T, float scale) = 0;

  // The residual stream's update and the LayerNorm that reads it, in one pass over the rows
  // (Note [Residual LayerNorm] in src/cpu/ops/layernorm.cpp): sum (rows, C) = a + b, then
  // layernorm_forward of sum into y (fp32, or rounded to bf16), mean and rstd; bit for bit add
  // followed by layernorm_forward. sum may alias a or b.
  virtual void residual_layernorm_forward(const float* a, const float* b, float* sum,
                                          const float* weight, const float* bias, float* y,
                                          float* mean, float* rstd, int rows, int C) = 0;
  virtual void residual_layernorm_forward(const float* a, const float* b, float* sum,
                                          const float* weight, const float* bias,
                                          std::uint16_t* y, float* mean, float* rstd, int rows,
                                          int C) = 0;
  // LayerNorm's backward with the residual's gradient added in the same pass: dx (rows, C) =
  // dresidual + d/dx, bit for bit a copy of dresidual followed by layernorm_backward (which is
  // this op with dresidual == dx); a null dresidual counts as zeros (as a filled dx would).
  // dx_bf16 (rows, C), when not null, receives dx rounded to bf16 (a matrix product's input),
  // without a to_bf16 pass. dweight, dbias (C) += their gradients. dx may alias dresidual.
  virtual void residual_layernorm_backward(const float* x, const float* weight, const float* mean,
                                           const float* rstd, const float* dy,
                                           const float* dresidual, float* dx,
                                           std::uint16_t* dx_bf16, float* dweight, float* dbias,
                                           int rows, int C) = 0;

  // RMSNorm (Llama, Qwen2, Mistral; Note [RMSNorm] in src/cpu/ops/layernorm.cpp), with the
  // residual add fused as the LayerNorm's: x = a, or with b not null sum (rows, C) = a + b
  // stored and read back (sum may alias a or b); y (rows, C) = x * rstd * weight (C), rstd
  // (rows) = 1 / sqrt(mean_c(x^2) + eps), saved for backward. y fp32, or rounded to bf16.
  virtual void residual_rmsnorm_forward(const float* a, const float* b, float* sum,
                                        const float* weight, float* y, float* rstd, int rows,
                                        int C, float eps) = 0;
  virtual void residual_rmsnorm_forward(const float* a, const float* b, float* sum,
                                        const float* weight, std::uint16_t* y, float* rstd,
                                        int rows, int C, float eps) = 0;
  // dx (rows, C) = dresidual (zeros when null) + d/dx of RMSNorm(x) given dy; dx may alias
  // dresidual; dx_bf16, when not null, receives dx rounded. dweight (C) += its gradient.
  virtual void residual_rmsnorm_backward(const float* x, const float* weight, const float* rstd,
                                         const float* dy, const float* dresidual, float* dx,
                                         std::uint16_t* dx_bf16, float* dweight, int rows,
                                         int C) = 0;

  // Rotary position embeddings in Hugging Face's rotate-half layout, in place on the q and k
  // heads of a qkv buffer (Note [RoPE] in src/cpu/ops/rope.cpp); v is left alone.
  virtual void rope_forward(const RopeShape& shape, const RopeTable& table, float* qkv) = 0;
  // The same on a bf16 qkv: widened, rotated in fp32, rounded.
  virtual void rope_forward(const RopeShape& shape, const RopeTable& table,
                            std::uint16_t* qkv) = 0;
  // The gradient of rope_forward: dqkv's q and k heads rotated back, in place. dqkv_bf16 (the
  // whole (B T, (H + 2 Hkv) D), v included), when not null, receives dqkv rounded to bf16 (the
  // qkv product's input).
  virtual void rope_backward(const RopeShape& shape, const RopeTable& table, float* dqkv,
                             std::uint16_t* dqkv_bf16) = 0;

 protected:
  ~LayerOps() = default;
};

// Causal multi-head self-attention of B sequences of T positions, H query heads of D channels,
// scale 1 / sqrt(D), as one op that never holds a (T, T) matrix (Note [Tiled attention] in
// src/cpu/ops/attention.cpp). model.attention `fused` runs it; `materialized` composes the
// attention from gemm_batched and the causal softmax instead, the reference it is tested against.
// Grouped-query attention (Llama-family decoders): Hkv = kv_heads key/value heads, Hkv dividing
// H, and query head h reads kv head h / (H / Hkv); Hkv = 1 is multi-query attention. kv_heads 0
// means H (GPT-2's multi-head attention), so {B, T, H, D} keeps its meaning. H D is the
// attention's width, not necessarily the model's d_model (a head_dim of its own).
struct LOCKSTEP_API AttentionShape {
  int batch = 0, T = 0, heads = 0, head_size = 0;
  int kv_heads = 0;
  // Packed sequences: (B, T) int32 in device memory, each row's position in its own sequence;
  // the query of row t at position p then reads keys t - p .. t only. Null: keys 0 .. t (Note
  // [Packed attention] in src/model/attention.hpp).
  const std::int32_t* positions = nullptr;
};

// The key/value heads a shape reads: kv_heads, or heads when kv_heads is 0.
constexpr int kv_heads_of(const AttentionShape& s) {
  return s.kv_heads > 0 ? s.kv_heads : s.heads;
}
// The columns of a qkv row, (H + 2 Hkv) D: 3 H D without grouping.
constexpr std::int64_t qkv_width(const AttentionShape& s) {
  return (std::int64_t{s.heads} + 2 * std::int64_t{kv_heads_of(s)}) * s.head_size;
}

class LOCKSTEP_API AttentionOps {
 public:
  // qkv (B T, (H + 2 Hkv) D): the H query heads side by side (columns [0, H D)), then the Hkv
  // key heads, then the Hkv value heads, head h at columns h D of its block (RopeShape's
  // layout; (B T, 3C) with C = H D without grouping); y (B T, H D) = softmax_causal(q k^T /
  // sqrt(D)) v per sequence and query head, with k and v of its kv head, heads side by side, in
  // y's storage; lse (B, H, T) = log of each row's softmax denominator over the scaled scores
  // (its max plus the log of the sum), all that backward needs of the probabilities. In bf16 the
  // products read bf16 operands (the probabilities rounded, as the materialised path keeps them)
  // and accumulate in fp32 (Note [bf16 compute] in src/model/ops.hpp).
  virtual void attention_forward(const AttentionShape& shape, MatIn qkv, MatOut y,
                                 float* lse) = 0;
  // dqkv (B T, (H + 2 Hkv) D), in qkv's layout = the gradients of q, k and v, overwritten (a kv
  // head's the sum over the query heads that read it), from dy (B T, H D) as the products read
  // it (fp32, or rounded to bf16), y as forward stored it, and lse. bf16: the score gradients
  // are rounded before their products, as the materialised path rounds them.
  virtual void attention_backward(const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                                  const float* lse, float* dqkv) = 0;

 protected:
  ~AttentionOps() = default;
};

// Reductions. sum_squares and hash return host values and wait for the queue; the others leave
// their results in device memory.
class LOCKSTEP_API ReductionOps {
 public:
  // Sum of squares of x[0..n), accumulated in double on the CPU.
  virtual double sum_squares(const float* x, std::size_t n) = 0;
  // Sums of squares of x[0..n) grain by grain: out[g] = sum of x[i]^2 over i in [g grain,
  // min(n, (g + 1) grain)), accumulated in double; out (device memory) has (n + grain - 1) /
  // grain entries. A
  // grain's sum depends only on its own elements, not on n nor on where the call starts, so
  // calls over different ranges that share a grain agree on it bit for bit (ZeRO-1's norm,
  // Note [ZeRO-1] in src/train/reducer.hpp). The CPU adds each grain's squares in order.
  virtual void sum_squares_grains(const float* x, std::size_t n, std::size_t grain,
                                  double* out) = 0;
  // The optimiser step's scalars from the squared gradient norm's grain sums (device memory,
  // `grains` of them): control->grad_norm = sqrt of their sum, added in order from 0;
  // clip_scale and skip as detail::step_scalars (src/common/elementwise_math.hpp) makes them.
  virtual void step_control(const double* grain_sums, std::size_t grains, double clip_norm,
                            StepControl* control) = 0;
  // Order-independent 64-bit hash of the bit patterns of x[0..n) and their positions.
  // Equal buffers hash equal on every backend; used to prove replicas are identical.
  virtual std::uint64_t hash(const float* x, std::size_t n) = 0;

 protected:
  ~ReductionOps() = default;
};

// Parameter updates, in place.
class LOCKSTEP_API OptimizerOps {
 public:
  // Both read *control (device memory) when it is not null: the gradient is grads *
  // control->clip_scale (grads itself is left alone), and a nonzero control->skip leaves params
  // and state unchanged. Null: the gradient is grads, and the step is taken.
  // When params_bf16 is not null, the same pass writes each updated parameter rounded to bf16
  // there (to nearest even, as to_bf16): the weights a bf16 step computes with (Note [bf16
  // compute] in src/model/ops.hpp). A skipped step leaves it alone too.
  //
  // One SGD step, PyTorch semantics (dampening 0): g += wd * p; buf = momentum * buf + g;
  // g = nesterov ? g + momentum * buf : buf; p -= lr * g. momentum_buf may be null if momentum == 0.
  virtual void sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                        float* momentum_buf, std::size_t n, const StepControl* control,
                        std::uint16_t* params_bf16) = 0;
  // One AdamW step, PyTorch semantics, with step count t >= 1 for bias correction.
  virtual void adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                          const float* grads, float* m, float* v, std::size_t n,
                          const StepControl* control, std::uint16_t* params_bf16) = 0;

 protected:
  ~OptimizerOps() = default;
};

class LOCKSTEP_API Device : public MemoryOps,
                            public BlasOps,
                            public LinearOps,
                            public ElementwiseOps,
                            public LayerOps,
                            public AttentionOps,
                            public ReductionOps,
                            public OptimizerOps {
 public:
  virtual ~Device() = default;

  virtual std::string_view backend() const noexcept = 0;
  virtual int id() const noexcept = 0;
  // "cpu:0", "cuda:1": used in logs and error messages.
  std::string label() const { return std::string(backend()) + ":" + std::to_string(id()); }
  // The queue this device's operations run on. The default, the calling thread, suits devices
  // whose operations finish before they return.
  virtual DeviceQueue queue() const noexcept { return {backend(), id(), nullptr}; }
  // A buffer of `bytes` for batches copied in while the device computes (see StagedBuffer).
  // The default copies synchronously with copy_to_device; a GPU stages through pinned memory on
  // a copy stream. Destroy the buffer before its device.
  virtual std::unique_ptr<StagedBuffer> make_staged_buffer(std::size_t bytes);
  // Note [Downloads]. The default copies synchronously with copy_to_host (host syncs); a GPU
  // copies on a stream of its own. Destroy the download before its device.
  virtual std::unique_ptr<Download> make_download();
  // `bytes` of host memory for a Download to copy into: plain memory, or pinned on a GPU (which
  // its copies need to overlap the kernels). Not zeroed.
  virtual HostMemory allocate_host(std::size_t bytes);
  // A host copy of `bytes` of device memory, queued now and collected later (Note [Deferred
  // reads]). The default copies when collected. Destroy it before its device.
  virtual std::unique_ptr<HostReadback> make_host_readback(std::size_t bytes);

  // Note [Device graphs]. Empty where this device can capture its ops; else why it cannot.
  virtual std::string graphs_unsupported() const;
  // Records the ops called from here on this thread, without running them. Throws where
  // graphs_unsupported() is not empty.
  virtual void begin_capture();
  // The ops recorded since begin_capture(), as a graph; null when there were none.
  virtual std::unique_ptr<DeviceGraph> end_capture();
  // Drops the capture in progress, if any (after a refused op threw): the device is as it was.
  virtual void abort_capture() noexcept {}

  // softmax_cross_entropy's loss and correct count, read back at once (two host syncs and a
  // small allocation: for tests and tools, not for a training step). Throws InputError for a
  // label outside [0, classes).
  LossStats softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                  int classes, float* dlogits, float grad_scale);
  using LayerOps::softmax_cross_entropy;

  // Note [Abortable waits]
  //   Work on a device's queue may wait for a collective, and a collective whose peer died never
  //   finishes: a host thread blocked in cudaStreamSynchronize behind it would never return,
  //   out of reach of any abort. So every wait of a device for its queue goes through
  //   wait_until, which polls (cudaStreamQuery, cudaEventQuery), backing off from yields to
  //   short sleeps, and asks the abort check between polls; once that says the group is
  //   aborted, the wait throws CommAborted instead. Communicator::attach installs the check.

  // The check wait_until asks; none (the default) waits as long as it takes.
  void set_abort_check(std::function<bool()> aborted) { abort_check_ = std::move(aborted); }
  bool abort_requested() const { return abort_check_ && abort_check_(); }
  // Returns once done() is true; throws CommAborted once abort_requested() is true first (Note
  // [Abortable waits]). It polls as a blocking CUDA synchronisation spins: for the first
  // millisecond it only yields between polls, so a short wait ends within microseconds of its
  // work; then it sleeps, 10 us at first, growing to 100 us, so a long wait costs little CPU
  // and ends at most about 0.1 ms late. On the CPU nothing waits: a CPU device's work is done
  // when its call returns.
  void wait_until(const std::function<bool()>& done) const {
    using namespace std::chrono;
    const auto spin_until = steady_clock::now() + milliseconds(1);
    auto pause = microseconds(10);
    while (!done()) {
      if (abort_requested()) throw CommAborted();
      if (steady_clock::now() < spin_until) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(2 * pause, microseconds(100));
    }
  }

 private:
  std::function<bool()> abort_check_;
};

// Owns `size` elements of T on a device. Move-only.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Device& device, std::size_t size)
      : device_(&device),
        data_(static_cast<T*>(size ? device.allocate(size * sizeof(T)) : nullptr)),
        size_(size) {}
  DeviceArray(DeviceArray&& other) noexcept { swap(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    DeviceArray(std::move(other)).swap(*this);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_) device_->deallocate(data_);
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

  void upload(std::span<const T> host) {
    if (!host.empty()) device_->copy_to_device(data_, host.data(), host.size_bytes());
  }
  std::vector<T> download() const {
    std::vector<T> out(size_);
    if (size_) device_->copy_to_host(out.data(), data_, size_ * sizeof(T));
    return out;
  }

 private:
  void swap(DeviceArray& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  Device* device_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// The default StagedBuffer: device memory filled synchronously by copy_to_device, so it is ready
// as soon as stage() returns.
class CopyStagedBuffer final : public StagedBuffer {
 public:
  CopyStagedBuffer(Device& device, std::size_t bytes) : device_(device), memory_(device, bytes) {}
  std::size_t bytes() const noexcept override { return memory_.size(); }
  void stage(std::span<const std::byte> host) override {
    if (host.size() > memory_.size())
      throw std::invalid_argument("StagedBuffer::stage: " + std::to_string(host.size()) +
                                  " bytes into a buffer of " + std::to_string(memory_.size()));
    if (!host.empty()) device_.copy_to_device(memory_.data(), host.data(), host.size());
  }
  void wait() override {}

 private:
  void* device_pointer() noexcept override { return memory_.data(); }
  Device& device_;
  DeviceArray<std::byte> memory_;
};

inline std::unique_ptr<StagedBuffer> Device::make_staged_buffer(std::size_t bytes) {
  return std::make_unique<CopyStagedBuffer>(*this, bytes);
}

// The default Download: copy_to_host at start(), so every copy has landed when it returns.
class CopyDownload final : public Download {
 public:
  explicit CopyDownload(Device& device) : device_(device) {}
  void start(std::span<const Transfer> copies) override {
    for (const Transfer& t : copies)
      if (t.bytes) device_.copy_to_host(t.host, t.device, t.bytes);
  }
  void fence() override {}
  bool done() override { return true; }
  void wait() override {}

 private:
  Device& device_;
};

inline std::unique_ptr<Download> Device::make_download() {
  return std::make_unique<CopyDownload>(*this);
}

inline HostMemory Device::allocate_host(std::size_t bytes) {
  return HostMemory(new std::byte[std::max<std::size_t>(bytes, 1)]);
}

// The default HostReadback: copy_to_host in wait(), from the pointer start() was given.
class CopyHostReadback final : public HostReadback {
 public:
  CopyHostReadback(Device& device, std::size_t bytes) : device_(device), host_(bytes) {}
  std::size_t bytes() const noexcept override { return host_.size(); }
  void start(const void* src) override { src_ = src; }
  std::span<const std::byte> wait() override {
    if (!src_) throw std::logic_error("HostReadback::wait without start");
    device_.copy_to_host(host_.data(), src_, host_.size());
    return host_;
  }

 private:
  Device& device_;
  std::vector<std::byte> host_;
  const void* src_ = nullptr;
};

inline std::string Device::graphs_unsupported() const {
  return "the " + std::string(backend()) +
         " backend runs each op as it is called: it has no graphs to capture";
}

inline void Device::begin_capture() { throw std::logic_error(graphs_unsupported()); }

inline std::unique_ptr<DeviceGraph> Device::end_capture() {
  throw std::logic_error(graphs_unsupported());
}

inline std::unique_ptr<HostReadback> Device::make_host_readback(std::size_t bytes) {
  return std::make_unique<CopyHostReadback>(*this, bytes);
}

struct LOCKSTEP_API DeviceInfo {
  std::string backend;
  int id = 0;
  std::string name;
  std::size_t memory_bytes = 0;
  std::string detail;  // e.g. compute capability, or threads for the CPU
  // The library and kernels of its matrix products, e.g. "oneDNN 2.6 brg:avx512_core (fp32),
  // brg:avx512_core_bf16 (bf16)" (Note [CPU matrix products]), or "cuBLAS (fp32)".
  std::string matmul;
};

class LOCKSTEP_API Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const noexcept = 0;
  // The devices this backend can use right now. Empty when none is usable.
  virtual std::vector<DeviceInfo> devices() const = 0;
  // One communicator per worker, all in one group. Called on the host thread before the
  // workers start; worker r uses element r only. With `processes` (more than one), the group
  // spans every process: worker r of process p is rank p x device_ids.size() + r, and every
  // process calls this together, with as many ids.
  virtual std::vector<std::unique_ptr<Communicator>> create_communicators(
      std::span<const int> device_ids, std::shared_ptr<ProcessGroup> processes) = 0;
  // This process alone.
  std::vector<std::unique_ptr<Communicator>> create_communicators(std::span<const int> device_ids);
  // Whether create_communicators may be called again, over the devices that survive, once a
  // group over `device_ids` was aborted because one of its devices was lost:
  // trainer.on_worker_failure: shrink needs it (Note [Shrink] in src/train/recovery.hpp). The
  // CPU's and the CUDA backend's can (each group is made anew, peer or NCCL).
  virtual bool rebuilds_communicators(std::span<const int> /*device_ids*/) const noexcept {
    return false;
  }
  // Called on the worker's own thread, once. `workers` is the number of workers sharing the
  // machine, so CPU devices can divide the cores between them.
  virtual std::unique_ptr<Device> create_device(int device_id, int workers,
                                                int threads_per_device) = 0;
};

// Settings of the GPU backend (trainer.comm, trainer.precision); the CPU backend has none.
struct LOCKSTEP_API BackendOptions {
  CommKind comm = CommKind::automatic;
  Precision precision = Precision::fp32;
};

// The attention a GPT's blocks run on a backend's devices (model.attention), resolved.
struct LOCKSTEP_API AttentionChoice {
  AttentionKind path = AttentionKind::materialized;  // fused or materialized, never automatic
  // What runs, and why: "tiled, online softmax (auto)", "(T, T) matrices (auto: cuDNN's fused
  // attention takes half-precision inputs, ...)".
  std::string detail;
};

// model.attention `requested` on the backend named `backend` ("cpu" or "cuda") under
// `precision`, for sequences of `context` positions and heads of `head_size` channels (0:
// unknown). auto picks the fused path where the backend has one and it measured at least as
// fast as the materialised one (bench/RESULTS.md): the CPU's tiled attention in bf16, and in
// fp32 (and tf32) from kFusedAttentionContext; on cuda cuDNN's under bf16 (pending a GPU
// measurement) when cuDNN takes the head size (a multiple of 8; with a GPU, its graphs for the
// shape are built once to ask); the materialised path otherwise, with the reason in `detail`.
// fused where it cannot run (no fused path, fp32 or tf32 on cuda, a head size cuDNN refuses)
// throws InputError naming the key and why.
inline constexpr int kFusedAttentionContext = 256;
LOCKSTEP_API AttentionChoice choose_attention(AttentionKind requested, std::string_view backend,
                                              Precision precision, int context,
                                              int head_size = 0);

// Dense peak FLOP/s of one GPU for fp32 GEMMs (Precision::fp32), TF32 tensor-core GEMMs (tf32)
// or bf16 tensor-core GEMMs with fp32 accumulation (bf16), from a table of data-sheet figures
// matched against the device name ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", ...); nullopt for a
// device the table does not know, or whose bf16 figure it lacks. Used for model FLOPs
// utilisation.
LOCKSTEP_API std::optional<double> peak_flops(std::string_view device_name, Precision precision);

// The CPU backend: N devices are N worker threads, joined by a shared-memory communicator.
LOCKSTEP_API std::unique_ptr<Backend> make_cpu_backend();

// What this build's CUDA backend links, and whether the driver lets it run, for `lockstep
// devices`. Asks the driver, never throws.
struct LOCKSTEP_API CudaSupport {
  bool built = false;   // false: lockstep was built without the CUDA backend
  int gpus = 0;         // GPUs this process can use
  std::string summary;  // e.g. "no NVIDIA driver found; CUDA runtime 13.0, cuBLAS 13.1, NCCL
                        // 2.28.9 linked"; empty when !built
  // What runs the fused attention: "cuDNN 9.19.0 loaded (headers 9.19.0), frontend 1.32.0,
  // SDPA forward composite"; empty when the build has no cuDNN fused attention.
  std::string cudnn;
};
LOCKSTEP_API CudaSupport cuda_support();

// BackendKind::automatic picks CUDA when GPUs are usable and every id in `device_ids` names one
// (repeated ids share a GPU); the CPU otherwise.
LOCKSTEP_API std::unique_ptr<Backend> make_backend(BackendKind kind,
                                                   std::span<const int> device_ids = {},
                                                   const BackendOptions& options = {});
// The name ("cpu", "cuda") of the backend make_backend(kind, device_ids) makes, without making
// it (automatic asks the driver for the GPUs, as make_backend does).
LOCKSTEP_API std::string_view backend_name(BackendKind kind, std::span<const int> device_ids);

// A CPU device. `threads` is the size of its private oneTBB arena (at least 1).
LOCKSTEP_API std::unique_ptr<Device> make_cpu_device(int id, int threads);

// The arena size the CPU backend gives each of `workers` devices: `threads_per_device` when
// positive, else an equal share of the hardware threads (at least 1).
LOCKSTEP_API int cpu_threads_per_device(int workers, int threads_per_device);

}  // namespace lockstep
