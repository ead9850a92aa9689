#!/usr/bin/env bash
# Issue 16's CUDA checks, after scripts/gpu_check.sh built build-gpu/: the bf16 conversion
# kernels against the CPU device, the bf16 GEMMs and the optimiser steps' bf16 copy of the
# parameters, and the NCCL bf16 all-reduce (one rank per GPU, at most 2), then a short gpt_tiny
# run with trainer.grad_reduce_dtype: bf16 on GPU 0. Under a minute.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${BUILD:-build-gpu}"
"$BUILD/tests/lockstep_tests" -s \
  -tc='cuda: to_bf16*,cuda: gemm_bf16*,cuda: sgd_step*params_bf16*,cuda: the NCCL bf16*'
"$BUILD/lockstep" train configs/gpt_tiny.yaml --set trainer.backend=cuda \
  --set trainer.devices=1 --set trainer.steps=50 --set trainer.eval_every=0 \
  --set trainer.grad_reduce_dtype=bf16 --set trainer.checkpoint.dir=null |
  grep -E "gradient bytes|replicas identical|eval loss"
