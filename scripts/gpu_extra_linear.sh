#!/usr/bin/env bash
# Issue 16, cuBLASLt's fused epilogues for the linear layers (Note [Fused linear] in
# include/lockstep/device.hpp), after scripts/gpu_check.sh built build-gpu/: GPT-2 124M (batch
# 8, one GPU) in tf32 and bf16, each with the linear layers fused (the default) and composed of
# plain kernels (LOCKSTEP_CUDA_LINEAR=composed), one after the other. Prints the median step
# time of each (over 10 steps after 3 of warm-up) and the fusion's speedup, and checks that the
# two ways' final train losses agree within 1%. About a minute on an H200.
#
#   bash scripts/gpu_extra_linear.sh    # from the repository root
#
# Exit status: 0 when every run finishes and the losses agree; 1 otherwise.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${LOCKSTEP_GPU_BUILD:-build-gpu}"
python3 - "$BUILD/lockstep" << 'PY'
import argparse, array, json, os, random, sys, tempfile
sys.path[:0] = ["bench", os.path.join("tests", "model")]
from compare_gpt import run_lockstep  # a `lockstep train` run timed from its metrics stream

preset = dict(vocab=50257, context=1024, n_layer=12, n_head=12, d_model=768)
args = argparse.Namespace(batch=8, warmup=3, steps=10, device="cuda", tf32=True, threads=0)
step_ms, losses = {}, {}
failed = False
with tempfile.TemporaryDirectory() as folder:
    rng = random.Random(0)
    windows = (args.warmup + args.steps) * args.batch + 1
    tokens = array.array("H", (rng.randrange(preset["vocab"])
                               for _ in range(windows * preset["context"] + 1)))
    with open(os.path.join(folder, "tokens.bin"), "wb") as f:
        tokens.tofile(f)
    for precision in ("fp32", "bf16"):  # fp32 runs as tf32 (args.tf32)
        for mode in ("fused", "composed"):
            os.environ["LOCKSTEP_CUDA_LINEAR"] = mode
            r = run_lockstep(sys.argv[1], folder, preset, args, precision)
            if "error" in r:
                print("gpu_extra_linear: %s %s FAILED: %s" % (precision, mode, r["error"]))
                failed = True
                continue
            step_ms[(precision, mode)] = r["step_ms"]
            with open(os.path.join(folder, "summary.json")) as f:
                losses[(precision, mode)] = json.load(f)["final_train_loss"]
for precision in ("fp32", "bf16"):
    if (precision, "fused") not in step_ms or (precision, "composed") not in step_ms:
        continue
    f, c = step_ms[(precision, "fused")], step_ms[(precision, "composed")]
    lf, lc = losses[(precision, "fused")], losses[(precision, "composed")]
    agree = abs(lf / lc - 1) <= 0.01
    failed = failed or not agree
    print("gpu_extra_linear: GPT-2 124M %s step %.1f ms fused, %.1f ms composed: %.2fx; "
          "train loss %.4f fused, %.4f composed%s"
          % ("tf32" if precision == "fp32" else precision, f, c, c / f, lf, lc,
             "" if agree else " (DIFFER by more than 1%)"))
sys.exit(1 if failed else 0)
PY
