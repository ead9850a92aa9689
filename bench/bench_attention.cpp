// A GPT block's causal self-attention alone, forward + backward, per path (model.attention:
// materialized, and fused: the CPU's tiled online softmax, Note [Tiled attention], or on
// --backend cuda cuDNN's, Note [cuDNN attention], bf16 only; and on cuda fused-nondeterministic,
// cuDNN's with the non-deterministic backward, timed beside the deterministic one the trainer
// runs), at B sequences of T positions, H heads of D channels (on --kv-heads Hkv key/value
// heads: grouped-query attention, Hkv = H by default). Prints a table and one JSON line
// per (T, path): the median time over --reps calls after --warmup (the paths alternating call by
// call), TFLOP/s, and the activation bytes each path holds. On cuda each timed call is --inner calls in a row (20 by default)
// between two waits for the GPU, so that the wait's own cost hardly counts.
//
//   build/bench/bench_attention [--T 256,1024,2048] [--batch 8] [--heads 12] [--head-size 64]
//                               [--kv-heads Hkv] [--reps 5] [--warmup 1] [--bf16] [--threads T]
//                               [--paths materialized,fused[,fused-nondeterministic]]
//                               [--backend cpu|cuda] [--inner N]
//
// FLOPs: forward 4 B H T^2 D (q k^T and P v), backward twice that (dP, dV, dQ, dK), counted as
// half for the causal mask: 6 B H T^2 D per forward + backward, whichever path and Hkv (the
// materialised path computes the masked half too; the tiled path skips most of it). Bytes:
// what forward keeps for backward (the probabilities (B, H, T, T), or the log-sum-exp (B, H,
// T)) plus the path's working memory ((B, H, T, T) fp32 for dP, and bf16 dS under bf16), the
// sizes a GPT block reserves for them (src/model/gpt.cpp); on cuda the fused path's working
// memory is the memory plan's figure for cuDNN's backward (Note [cuDNN attention memory] in
// src/train/memory_plan.hpp), and the JSON line adds cuDNN's own figure for its backward's
// workspace (cudnn_workspace_bytes), against which that estimate is to be checked.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/gemm_shape.hpp"
#include "common/random.hpp"
#include "lockstep/lockstep.hpp"
#include "model/attention.hpp"
#include "stats.hpp"
#include "train/memory_plan.hpp"

#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
#include "cuda/cudnn_attention.hpp"
#endif

using namespace lockstep;

namespace {

// A path: how attention runs, and for cuDNN's fused one which backward.
struct Path {
  AttentionKind kind = AttentionKind::fused;
  bool deterministic = true;
  std::string name() const {
    return deterministic ? std::string(to_string(kind)) : "fused-nondeterministic";
  }
};

struct Options {
  std::vector<int> T{256, 1024, 2048};
  int batch = 8, heads = 12, head_size = 64, kv_heads = 0;  // kv_heads 0: heads
  int reps = 5, warmup = 1, threads = 0, inner = 0;  // inner 0: 1 on the CPU, 20 on cuda
  bool bf16 = false;
  std::string backend = "cpu";
  std::vector<Path> paths{{AttentionKind::materialized}, {AttentionKind::fused}};
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + ": expected a value");
      return argv[++i];
    };
    if (flag == "--T") {
      o.T.clear();
      for (const std::string& t : split(value())) o.T.push_back(std::stoi(t));
    } else if (flag == "--batch") o.batch = std::stoi(value());
    else if (flag == "--heads") o.heads = std::stoi(value());
    else if (flag == "--head-size") o.head_size = std::stoi(value());
    else if (flag == "--kv-heads") o.kv_heads = std::stoi(value());
    else if (flag == "--reps") o.reps = std::stoi(value());
    else if (flag == "--warmup") o.warmup = std::stoi(value());
    else if (flag == "--threads") o.threads = std::stoi(value());
    else if (flag == "--bf16") o.bf16 = true;
    else if (flag == "--inner") o.inner = std::stoi(value());
    else if (flag == "--backend") {
      o.backend = value();
      if (o.backend != "cpu" && o.backend != "cuda")
        throw std::invalid_argument("--backend: expected cpu or cuda, got " + o.backend);
    }
    else if (flag == "--paths") {
      o.paths.clear();
      for (const std::string& p : split(value())) {
        if (p != "fused" && p != "materialized" && p != "fused-nondeterministic")
          throw std::invalid_argument(
              "--paths: expected fused, materialized and/or fused-nondeterministic, got " + p);
        o.paths.push_back({p == "materialized" ? AttentionKind::materialized : AttentionKind::fused,
                           p != "fused-nondeterministic"});
      }
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  return o;
}

// The buffers of one path at one shape, on the device, and their bytes.
struct PathBuffers {
  DeviceArray<float> lse, squares, probs32, y_product;
  DeviceArray<std::uint16_t> probs16, squares16;
  double kept_bytes = 0, working_bytes = 0;
  double cudnn_workspace = -1;  // cuDNN's fused path: its backward's workspace
  detail::AttentionBuffers view(AttentionKind path) {
    return {.path = path, .lse = lse.data(), .probs = {probs32.data(), probs16.data()},
            .squares = squares.data(), .squares16 = squares16.data(),
            .y_product = y_product.data()};
  }
};

PathBuffers buffers(Device& dev, AttentionKind path, const AttentionShape& s, bool bf16) {
  const std::size_t rows = std::size_t(s.batch) * s.heads * s.T, squares = rows * s.T;
  const std::size_t nc = std::size_t(s.batch) * s.T * s.heads * s.head_size;
  PathBuffers b;
  if (path == AttentionKind::fused) {
    b.lse = DeviceArray<float>(dev, rows);
    b.kept_bytes = 4.0 * rows;
    return b;
  }
  b.squares = DeviceArray<float>(dev, squares);
  b.probs32 = DeviceArray<float>(dev, bf16 ? 0 : squares);
  b.probs16 = DeviceArray<std::uint16_t>(dev, bf16 ? squares : 0);
  b.squares16 = DeviceArray<std::uint16_t>(dev, bf16 ? squares : 0);
  b.y_product = DeviceArray<float>(dev, bf16 ? nc : 0);
  b.kept_bytes = (bf16 ? 2.0 : 4.0) * squares;
  b.working_bytes = 4.0 * squares + (bf16 ? 2.0 * squares : 0.0);
  return b;
}

std::vector<float> uniform(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(2.0 * detail::uniform01(seed) - 1.0);
  return v;
}

// cuDNN's workspace for the backward of `s` (its plan from the process's cache, Note [cuDNN plan
// cache]), or -1 where this build has no cuDNN attention.
double cudnn_workspace_bytes([[maybe_unused]] const AttentionShape& s,
                             [[maybe_unused]] bool deterministic) {
#ifdef LOCKSTEP_HAVE_CUDNN_ATTENTION
  return static_cast<double>(
      cuda::CudnnAttention(nullptr, deterministic).workspace_bytes(s, /*backward=*/true));
#else
  return -1;
#endif
}

// The device of each path: cuDNN's non-deterministic backward on a device of its own, made with
// LOCKSTEP_CUDNN_BACKWARD=nondeterministic (read as a CUDA device is made); the others share one.
std::vector<Device*> path_devices(Backend& backend, const Options& o,
                                  std::vector<std::unique_ptr<Device>>& owned) {
  owned.push_back(backend.create_device(0, 1, o.threads));
  std::vector<Device*> devices;
  for (const Path& path : o.paths) {
    if (path.deterministic) {
      devices.push_back(owned.front().get());
      continue;
    }
    if (owned.size() == 1) {
      ::setenv("LOCKSTEP_CUDNN_BACKWARD", "nondeterministic", 1);
      owned.push_back(backend.create_device(0, 1, o.threads));
      ::unsetenv("LOCKSTEP_CUDNN_BACKWARD");
    }
    devices.push_back(owned.back().get());
  }
  return devices;
}

int run(const Options& o) {
  const bool cuda = o.backend == "cuda";
  for (const Path& path : o.paths) {
    if (cuda && path.kind == AttentionKind::fused && !o.bf16)
      throw std::invalid_argument(
          "--backend cuda: the fused path (cuDNN's) takes bf16; add --bf16");
    if (!cuda && !path.deterministic)
      throw std::invalid_argument(
          "--paths fused-nondeterministic: cuDNN's backward, on --backend cuda only");
  }
  const std::unique_ptr<Backend> backend =
      make_backend(cuda ? BackendKind::cuda : BackendKind::cpu);
  std::vector<std::unique_ptr<Device>> owned;
  const std::vector<Device*> devices = path_devices(*backend, o, owned);
  Device* const dev = owned.front().get();
  const int inner = o.inner > 0 ? o.inner : cuda ? 20 : 1;
  const std::vector<DeviceInfo> infos = backend->devices();
  const int kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  fmt::print("# {} ({}), {}; B={} H={} Hkv={} D={} {}, median of {} after {} warm-up\n",
             infos.empty() ? "?" : infos.front().name, infos.empty() ? "" : infos.front().detail,
             infos.empty() ? "" : infos.front().matmul, o.batch, o.heads, kv_heads, o.head_size,
             o.bf16 ? "bf16" : "fp32", o.reps, o.warmup);
  if (cuda) fmt::print("# cudnn: {}\n", cuda_support().cudnn);
  fmt::print("{:>6} {:>22} {:>10} {:>10} {:>10} {:>9} {:>12} {:>12}\n", "T", "path", "fwd ms",
             "bwd ms", "total ms", "TFLOP/s", "kept MB", "working MB");
  for (const int T : o.T) {
    const AttentionShape s{o.batch, T, o.heads, o.head_size, kv_heads};
    detail::check_attention_shape("--kv-heads", s);
    const std::size_t nc = std::size_t(o.batch) * T * o.heads * o.head_size;
    const std::size_t nqkv = std::size_t(o.batch) * T * std::size_t(qkv_width(s));
    DeviceArray<float> qkv(*dev, nqkv), dy(*dev, nc), y32(*dev, o.bf16 ? 0 : nc);
    DeviceArray<float> dqkv(*dev, nqkv);
    DeviceArray<std::uint16_t> qkv16(*dev, o.bf16 ? nqkv : 0), dy16(*dev, o.bf16 ? nc : 0);
    DeviceArray<std::uint16_t> y16(*dev, o.bf16 ? nc : 0);
    qkv.upload(uniform(nqkv, 1));
    dy.upload(uniform(nc, 2));
    if (o.bf16) {
      dev->to_bf16(qkv.data(), qkv16.data(), nqkv);
      dev->to_bf16(dy.data(), dy16.data(), nc);
    }
    // Another path's device (the same GPU) reads these once they are written.
    dev->synchronize();
    const MatIn q = o.bf16 ? MatIn{nullptr, qkv16.data()} : MatIn{qkv.data()};
    const MatIn g = o.bf16 ? MatIn{nullptr, dy16.data()} : MatIn{dy.data()};
    const MatOut y{y32.data(), y16.data()};
    const double flops = 6.0 * o.batch * o.heads * double(T) * T * o.head_size;
    // The paths alternate rep by rep, so that a change in the machine's load hits each alike.
    std::vector<PathBuffers> bufs;
    for (std::size_t p = 0; p < o.paths.size(); ++p) {
      bufs.push_back(buffers(*devices[p], o.paths[p].kind, s, o.bf16));
      if (cuda && o.paths[p].kind == AttentionKind::fused) {
        bufs.back().working_bytes =
            detail::cudnn_attention_backward_bytes(s, o.paths[p].deterministic);
        bufs.back().cudnn_workspace = cudnn_workspace_bytes(s, o.paths[p].deterministic);
      }
    }
    std::vector<std::vector<double>> fwd(o.paths.size()), bwd(o.paths.size());
    for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
      for (std::size_t p = 0; p < o.paths.size(); ++p) {
        Device& d = *devices[p];
        const detail::AttentionBuffers view = bufs[p].view(o.paths[p].kind);
        d.synchronize();
        const double t0 = bench::now_s();
        for (int i = 0; i < inner; ++i) detail::attention_forward(d, s, q, y, view);
        d.synchronize();
        const double t1 = bench::now_s();
        for (int i = 0; i < inner; ++i)
          detail::attention_backward(d, s, q, y.input(), g, view, dqkv.data());
        d.synchronize();
        const double t2 = bench::now_s();
        if (rep < o.warmup) continue;
        fwd[p].push_back((t1 - t0) / inner);
        bwd[p].push_back((t2 - t1) / inner);
      }
    }
    for (std::size_t p = 0; p < o.paths.size(); ++p) {
      const PathBuffers& b = bufs[p];
      const std::string path = o.paths[p].name();
      std::vector<double> total(fwd[p].size());
      for (std::size_t i = 0; i < total.size(); ++i) total[i] = fwd[p][i] + bwd[p][i];
      const double f = bench::median(fwd[p]), bk = bench::median(bwd[p]);
      const double t = bench::median(total);
      fmt::print("{:>6} {:>22} {:>10.2f} {:>10.2f} {:>10.2f} {:>9.4f} {:>12.2f} {:>12.2f}\n", T,
                 path, 1e3 * f, 1e3 * bk, 1e3 * t, flops / t * 1e-12, b.kept_bytes / 1e6,
                 b.working_bytes / 1e6);
      fmt::print(stderr,
                 "{{\"T\": {}, \"path\": \"{}\", \"batch\": {}, \"heads\": {}, \"kv_heads\": {}, "
                 "\"head_size\": {}, "
                 "\"backend\": \"{}\", \"precision\": \"{}\", \"forward_ms\": {:.4f}, "
                 "\"backward_ms\": {:.4f}, "
                 "\"total_ms\": {:.4f}, \"tflops\": {:.5f}, \"kept_bytes\": {}, "
                 "\"working_bytes\": {}, \"cudnn_workspace_bytes\": {}}}\n",
                 T, path, o.batch, o.heads, kv_heads, o.head_size, o.backend,
                 o.bf16 ? "bf16" : "fp32", 1e3 * f, 1e3 * bk, 1e3 * t, flops / t * 1e-12,
                 b.kept_bytes, b.working_bytes,
                 b.cudnn_workspace >= 0 ? fmt::format("{}", b.cudnn_workspace) : "null");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_attention: {}\n", e.what());
    return 2;
  }
}
