#!/usr/bin/env bash
# Issue 32, cuDNN's fused attention (Note [cuDNN attention] in src/cuda/cudnn_attention.hpp),
# after scripts/gpu_check.sh built build-gpu/: attention alone, forward + backward at GPT-2
# 124M's shape (B 8, H 12, D 64, T 1024, bf16), cuDNN's against the materialised path
# (bench_attention --backend cuda: TFLOP/s with causal FLOPs counted as half); then GPT-2 124M's
# bf16 step (batch 8, one GPU) with model.attention fused and materialized: the median step time
# of each over 6 steps after 3 of warm-up, the speedup, and the final train losses, which must
# agree within 2% (bf16 rounds the two paths at different points). About a minute on an H200.
#
#   bash scripts/gpu_extra_attention.sh    # from the repository root
#
# Exit status: 0 when every run finishes and the losses agree; 1 otherwise.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${LOCKSTEP_GPU_BUILD:-build-gpu}"
status=0
# The deterministic backward (the one training uses: bit-exact runs) beside the non-deterministic
# one, which needs no dP workspace (Note [cuDNN attention memory]): the choice, measured.
"$BUILD/bench/bench_attention" --backend cuda --bf16 --T 1024 --batch 8 --heads 12 \
  --head-size 64 --reps 5 --warmup 2 --paths materialized,fused,fused-nondeterministic || status=1
python3 - "$BUILD/lockstep" << 'PY' || status=1
import argparse, json, os, sys, tempfile
sys.path[:0] = ["bench", os.path.join("tests", "model")]
from compare_gpt import run_lockstep, write_random_tokens  # a `lockstep train` run timed from its metrics stream

preset = dict(vocab=50257, context=1024, n_layer=12, n_head=12, d_model=768)
args = argparse.Namespace(batch=8, warmup=3, steps=6, device="cuda", tf32=False, threads=0)
runs = {}
with tempfile.TemporaryDirectory() as folder:
    write_random_tokens(folder, preset, (args.warmup + args.steps) * args.batch + 1)
    for attention in ("fused", "materialized"):
        r = run_lockstep(sys.argv[1], folder, preset, args, "bf16", attention)
        if "error" in r:
            print("gpu_extra_attention: %s FAILED: %s" % (attention, r["error"]))
            continue
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
        r["loss"] = summary["final_train_loss"]
        r["ran"] = summary.get("attention")  # what model.attention resolved to
        runs[attention] = r
        print("gpu_extra_attention: bf16 step, attention %-12s %7.1f ms/step  loss %.4f  (ran %s)"
              % (attention, r["step_ms"], r["loss"], r["ran"]))
if len(runs) < 2:
    sys.exit(1)
f, m = runs["fused"], runs["materialized"]
print("gpu_extra_attention: fused step %.1f ms vs materialized %.1f ms: %.2fx"
      % (f["step_ms"], m["step_ms"], m["step_ms"] / f["step_ms"]))
if abs(f["loss"] - m["loss"]) > 0.02 * abs(m["loss"]):
    print("gpu_extra_attention: losses differ by more than 2%%: %.4f and %.4f"
          % (f["loss"], m["loss"]))
    sys.exit(1)
PY
exit "$status"
