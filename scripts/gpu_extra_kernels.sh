#!/usr/bin/env bash
# Issue 17's kernels on the GPU, after scripts/gpu_check.sh has built build-gpu/ (from the repo
# root): the CUDA tests of the changed kernels against the CPU device, then bench_kernels at
# GPT-2 124M's shapes (TF32 on, as the GPT benchmark). Prints a short result; exits non-zero
# when a test fails or the benchmark does not run. Under a minute on an H200.
set -uo pipefail
BUILD="${LOCKSTEP_GPU_BUILD:-build-gpu}"
status=0
"$BUILD/tests/lockstep_tests" -ts='cuda' \
  -tc='*add_bias*,*softmax_cross_entropy*,*activations*,gemm*,transformer: gemm_batched*,transformer: GPT-2 124M*' \
  2>&1 | tail -4 || status=1
"$BUILD/bench/bench_kernels" --tf32 || status=1
exit "$status"
