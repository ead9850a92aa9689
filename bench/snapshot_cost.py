#!/usr/bin/env python3
"""What in-memory snapshots cost a step (issue 28; Note [Snapshots] in src/train/snapshot.hpp).

One run of `lockstep train` on a GPT preset with trainer.on_worker_failure: shrink and
trainer.snapshot_every K, every step logged. A snapshot is started after step s's barrier
(s a multiple of K) and overlaps step s + 1, so step s + 1 carries its cost: the script sets
the median time of those steps against the median of the others, after the warm-up steps, and
gives the cost per snapshot and its share of the step time at one snapshot every 50 steps (the
issue's goal: at most 2%). Random tokens, as bench/compare_gpt.py's.

    bench/snapshot_cost.py --build build --device cpu --preset tiny --devices 2 --every 5
    bench/snapshot_cost.py --build build --device cuda --preset 124m --batch 8 --precision bf16
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "tests", "model")]

PRESETS = {  # bench/gpt_torch.py's, without importing torch
    "tiny": dict(vocab=256, context=64, n_layer=4, n_head=4, d_model=128),
    "small": dict(vocab=512, context=128, n_layer=4, n_head=4, d_model=256),
    "124m": dict(vocab=50257, context=1024, n_layer=12, n_head=12, d_model=768),
}


def step_times(metrics):
    """{step: seconds from the previous step's end to its end} from a metrics stream."""
    with open(metrics) as f:
        ends = {d["step"]: d["elapsed_s"] for d in map(json.loads, f) if d.get("kind") == "step"}
    return {s: ends[s] - ends[s - 1] for s in ends if s - 1 in ends}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default="tiny", choices=PRESETS)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--devices", type=int, default=1, help="workers (on a GPU: replicas of GPU 0)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--every", type=int, default=10, help="trainer.snapshot_every")
    ap.add_argument("--snapshots", type=int, default=5, help="snapshots taken after the warm-up")
    ap.add_argument("--warmup", type=int, default=5, help="steps not timed")
    args = ap.parse_args()
    from compare_gpt import write_random_tokens
    from gpt_parity import lockstep_config

    preset = PRESETS[args.preset]
    steps = args.warmup + args.every * args.snapshots + 1
    with tempfile.TemporaryDirectory() as folder:
        write_random_tokens(folder, preset, steps * args.batch * args.devices + 1)
        metrics = os.path.join(folder, "metrics.jsonl")
        config = os.path.join(folder, "run.yaml")
        spec = {"vocab_size": preset["vocab"], "context": preset["context"],
                "n_layer": preset["n_layer"], "n_head": preset["n_head"],
                "d_model": preset["d_model"]}
        opt = {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
        with open(config, "w") as f:
            f.write(lockstep_config(spec, opt, {
                "tokens": os.path.join(folder, "tokens.bin"), "batch": args.batch,
                "steps": steps, "backend": args.device, "precision": args.precision,
                "metrics": metrics}))
        devices = "[" + ",".join("0" if args.device == "cuda" else str(i)
                                 for i in range(args.devices)) + "]"
        summary = os.path.join(folder, "summary.json")
        command = [os.path.join(args.build, "lockstep"), "train", config,
                   "--set", f"trainer.devices={devices}",
                   "--set", "trainer.on_worker_failure=shrink",
                   "--set", f"trainer.snapshot_every={args.every}",
                   "--summary-json", summary]
        if args.device == "cuda" and args.devices > 1:
            command += ["--set", "trainer.comm=peer"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit("snapshot_cost: lockstep failed: " + (done.stdout + done.stderr)[-2000:])
        times = step_times(metrics)
        with open(summary) as f:
            s = json.load(f)
    timed = {step: t for step, t in times.items() if step > args.warmup}
    after = [t for step, t in timed.items() if (step - 1) % args.every == 0]
    others = [t for step, t in timed.items() if (step - 1) % args.every != 0]
    base = statistics.median(others)
    cost = statistics.median(after) - base
    print(f"snapshot_cost: {args.preset} {args.precision} on {s['backend']} x{args.devices}, "
          f"batch {args.batch}: step {1e3 * base:.2f} ms (median of {len(others)}), the step "
          f"after a snapshot {1e3 * statistics.median(after):.2f} ms (median of {len(after)}); "
          f"{1e3 * cost:.2f} ms per snapshot, {100 * cost / (50 * base):.2f}% of the step time "
          f"at one every 50 steps (goal <= 2%)")


if __name__ == "__main__":
    main()
