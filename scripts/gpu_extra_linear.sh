#!/usr/bin/env bash
# Issue 16, cuBLASLt's fused epilogues for the linear layers (Note [Fused linear] in
# include/lockstep/device.hpp), after scripts/gpu_check.sh built build-gpu/: GPT-2 124M (batch
# 8, one GPU) in tf32 and bf16, each with the linear layers run the three ways of
# LOCKSTEP_CUDA_LINEAR: every epilogue fused (the default), only the bias ones (GELU as its own
# kernels), and composed of plain kernels. Prints the median step time of each (over 10 steps
# after 3 of warm-up) and the speedups over composed, and checks that the final train losses
# agree within 1%. Prints each run's linear products by how they ran (fused_linear in its
# summary: fused, partly fused, composed) and fails when a fused run had any product refused
# (issue 25: the bf16 bias types). The bf16 runs' step includes the fused classifier (Note
# [Fused classifier] in src/cpu/ops/softmax.cpp). About a minute and a half on an H200.
#
#   bash scripts/gpu_extra_linear.sh    # from the repository root
#
# Exit status: 0 when every run finishes and the losses agree; 1 otherwise.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${LOCKSTEP_GPU_BUILD:-build-gpu}"
python3 - "$BUILD/lockstep" << 'PY'
import argparse, json, os, sys, tempfile
sys.path[:0] = ["bench", os.path.join("tests", "model")]
from compare_gpt import run_lockstep, write_random_tokens  # a `lockstep train` run timed from its metrics stream

preset = dict(vocab=50257, context=1024, n_layer=12, n_head=12, d_model=768)
args = argparse.Namespace(batch=8, warmup=3, steps=10, device="cuda", tf32=True, threads=0)
MODES = ("fused", "bias", "composed")
step_ms, losses, linear = {}, {}, {}
failed = False
with tempfile.TemporaryDirectory() as folder:
    write_random_tokens(folder, preset, (args.warmup + args.steps) * args.batch + 1)
    for precision in ("fp32", "bf16"):  # fp32 runs as tf32 (args.tf32)
        for mode in MODES:
            os.environ["LOCKSTEP_CUDA_LINEAR"] = mode
            r = run_lockstep(sys.argv[1], folder, preset, args, precision)
            if "error" in r:
                print("gpu_extra_linear: %s %s FAILED: %s" % (precision, mode, r["error"]))
                failed = True
                continue
            step_ms[(precision, mode)] = r["step_ms"]
            for line in r["warnings"]:  # cuBLASLt's refusals, once per problem
                print("gpu_extra_linear: %s %s: %s" % (precision, mode, line))
            with open(os.path.join(folder, "summary.json")) as f:
                summary = json.load(f)
            losses[(precision, mode)] = summary["final_train_loss"]
            linear[(precision, mode)] = summary["fused_linear"]
for precision in ("fp32", "bf16"):
    done = [m for m in MODES if (precision, m) in step_ms]
    if "composed" not in done:
        continue
    base, base_loss = step_ms[(precision, "composed")], losses[(precision, "composed")]
    for m in done:
        agree = abs(losses[(precision, m)] / base_loss - 1) <= 0.01
        failed = failed or not agree
        print("gpu_extra_linear: GPT-2 124M %s %-8s step %6.1f ms, %.2fx of composed, "
              "train loss %.4f%s" % ("tf32" if precision == "fp32" else precision, m,
                                     step_ms[(precision, m)], base / step_ms[(precision, m)],
                                     losses[(precision, m)],
                                     "" if agree else " (DIFFERS from composed by more than 1%)"))
for (precision, mode), n in sorted(linear.items()):
    refused = mode == "fused" and n["partial"] + n["composed"] > 0
    failed = failed or refused
    print("gpu_extra_linear: GPT-2 124M %s %-8s linear products: %d fused, %d partly, %d composed%s"
          % ("tf32" if precision == "fp32" else precision, mode, n["fused"], n["partial"],
             n["composed"], " (REFUSED by cuBLASLt: its warnings above)" if refused else ""))
sys.exit(1 if failed else 0)
PY
