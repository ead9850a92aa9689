// The CUDA device's fully connected maps (cuBLASLt with fused epilogues, or its fallback to plain
// kernels) against the CPU device's, which define them (Note [Fused linear] in
// lockstep/device.hpp), in every storage and activation, on fresh random inputs. Shapes whose
// widths are multiples of 8 take the fused epilogues; odd widths the fallback. Skip without a
// GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "../linear_cases.hpp"
#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

Tolerance tolerance(LinearVariant v, bool bf16, int terms, int row) {
  return linear_tolerance(v.gelu, bf16, terms, row);
}

}  // namespace

TEST_SUITE("cuda") {
  // Every way the CUDA device runs them (LOCKSTEP_CUDA_LINEAR): every epilogue fused (the
  // default), only the bias ones, and composed of plain kernels, so a failure says which is
  // wrong.
  TEST_CASE("cuda: linear_forward and linear_backward against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    for (const char* mode : {"fused", "bias", "composed"}) {
      CAPTURE(mode);
      ::setenv("LOCKSTEP_CUDA_LINEAR", mode, 1);
      auto gpu = backend->create_device(0, 1, 0);
      ::unsetenv("LOCKSTEP_CUDA_LINEAR");
      for (auto [rows, in, out] : {std::tuple{64, 96, 384}, {300, 768, 3072}, {37, 13, 21}}) {
        const LinearCase c(rows, in, out, 900 + rows);
        for (const LinearVariant v : linear_variants()) {
          CAPTURE(v.name());
          CAPTURE(rows);
          // y and pre (rows, out): sums over in.
          compare(*gpu, [&](Device& d) { return run_linear_forward(d, c, v, true); },
                  tolerance(v, v.bf16_out, in, out));
          if (v.bf16_out != v.bf16_in) continue;
          // A fused input gradient writing dx rounded leaves the fp32 dx unspecified.
          const bool with_dx32 = !v.bf16_in;
          // dweight (out, in) and the bias gradients sum over the rows, dx (rows, in) over out.
          compare(*gpu, [&](Device& d) { return run_linear_backward(d, c, v, true, with_dx32); },
                  tolerance(v, v.bf16_in, std::max(rows, out), in));
        }
      }
    }
  }
}

TEST_SUITE("cuda") {
  // GPT-2 124M's shapes under bf16 (C 768, 4C 3072, 8 sequences of 1024: 8192 rows): every
  // product of a forward and backward is one cuBLASLt call with its epilogue, none refused into
  // a partly fused or composed form (Note [Fused linear]). Two blocks: the others repeat them.
  TEST_CASE("cuda: GPT-2 124M's linear products under bf16 all take the fused epilogues") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const Model model =
        Model::gpt({.vocab_size = 50257, .context = 1024, .n_layer = 2, .n_head = 12,
                    .d_model = 768});
    const int batch = 8;
    Replica replica(*gpu, model, batch, Precision::bf16);
    replica.load_parameters(model.initial_parameters(1));
    replica.warm_up(batch);
    gpu->synchronize();
    const LinearCounts n = gpu->linear_counts();
    CAPTURE(n.fused);
    CAPTURE(n.partial);
    CAPTURE(n.composed);
    // Per block: 4 forwards, 4 weight gradients, 4 input gradients.
    CHECK(n.fused == 2 * 12);
    CHECK(n.partial == 0);
    CHECK(n.composed == 0);
  }
}
