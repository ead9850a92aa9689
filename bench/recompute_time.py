#!/usr/bin/python3
"""Step time of trainer.recompute none, selective and full, side by side in one run (issue 45).

GPT-2 124M's blocks and vocabulary (configs/gpt2_124m.yaml) at a shape two CPU cores run in
reasonable time (--batch sequences of --context tokens, bf16, fused attention, AdamW, one worker
on the CPU backend). Each round runs the three modes one after the other, each a fresh
`lockstep train` of --steps steps; a run's step time is the median of its per-step times after
the first step (differences of elapsed_s in trainer.metrics' JSON lines, logged every step).
The table gives the median over --rounds rounds, and each mode's cost against none (the median
of the per-round ratios, which cancels some of a shared machine's drift).

    /usr/bin/python3 bench/recompute_time.py [--lockstep build/lockstep] [--rounds 5]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from memory_table import token_file

ROOT = Path(__file__).resolve().parent.parent
MODES = ("none", "selective", "full")


def step_time(lockstep, data, directory, mode, args):
    metrics = Path(directory) / f"metrics_{mode}.jsonl"
    metrics.unlink(missing_ok=True)
    overrides = [f"data.path={data}", "data.eval_path=", "trainer.backend=cpu",
                 "trainer.checkpoint.dir=", "model.attention=fused", "trainer.precision=bf16",
                 f"model.context={args.context}", f"data.batch_size={args.batch}",
                 f"trainer.steps={args.steps}", "trainer.devices=1",
                 f"trainer.threads_per_device={args.threads}", "trainer.eval_every=0",
                 "trainer.log_every=1", "schedule.warmup_steps=1", f"trainer.metrics={metrics}",
                 "data.eval_fraction=0", f"trainer.recompute={mode}"]
    cmd = [lockstep, "train", str(ROOT / "configs/gpt2_124m.yaml")]
    for o in overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    elapsed = [json.loads(line)["elapsed_s"] for line in metrics.read_text().splitlines()
               if json.loads(line)["kind"] == "step"]
    return statistics.median(b - a for a, b in zip(elapsed[1:], elapsed[2:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lockstep", default=str(ROOT / "build/lockstep"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    times = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as d:
        data = token_file(d, 64 * 1024 + 1, 50257)
        for r in range(args.rounds):
            for m in MODES:
                times[m].append(step_time(args.lockstep, data, d, m, args))
            print(f"round {r + 1}: " + ", ".join(f"{m} {times[m][-1] * 1e3:.0f} ms" for m in MODES),
                  flush=True)
    print(f"\n## Step time, GPT-2 124M shapes, B {args.batch} x T {args.context}, bf16, fused "
          f"attention, AdamW, 1 worker x {args.threads} threads, {args.steps} steps per run, "
          f"median of {args.rounds} rounds\n")
    print("| recompute | step ms (median) | min | max | cost vs none (median of per-round ratios) |")
    print("|---|---|---|---|---|")
    for m in MODES:
        ratio = statistics.median(t / n for t, n in zip(times[m], times["none"]))
        print(f"| {m} | {statistics.median(times[m]) * 1e3:.0f} | {min(times[m]) * 1e3:.0f} | "
              f"{max(times[m]) * 1e3:.0f} | {100 * (ratio - 1):+.1f}% |")


if __name__ == "__main__":
    main()
