#!/usr/bin/python3
"""Step time and optimiser-state bytes per worker, trainer.zero 0 against 1, on the CPU.

Runs `lockstep train` on each workload at each worker count, alternating zero 0 and zero 1 for
--rounds rounds, and prints a Markdown table of the median step time (wall time over steps,
from --summary-json) and the most optimiser-state bytes any worker holds.

    /usr/bin/python3 bench/compare_zero.py --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

# name -> (config, overrides)
WORKLOADS = {
    "GPT (configs/gpt_tiny.yaml, 0.8M parameters, AdamW)": (
        "configs/gpt_tiny.yaml",
        ["trainer.steps=30", "trainer.eval_every=0", "trainer.checkpoint.dir=",
         "trainer.check_replicas_every=0"]),
    "large MLP 1024-2048-2048-10 (6.3M parameters, AdamW, batch 128/worker)": (
        "configs/quickstart.yaml",
        ["data.dataset=synthetic", "data.features=1024", "data.classes=10", "data.samples=8192",
         "model.hidden=[2048,2048]", "data.batch_size=128", "optimizer.type=adamw",
         "optimizer.momentum=", "optimizer.lr=0.001", "trainer.steps=30", "trainer.eval_every=0",
         "trainer.check_replicas_every=0"]),
}


def run(lockstep, config, overrides, devices, zero, out, prefetch=False):
    cmd = [lockstep, "train", config, "--summary-json", str(out)]
    for o in overrides + [f"trainer.devices={devices}", f"trainer.zero={zero}"]:
        cmd += ["--set", o]
    env = dict(os.environ)
    env.pop("LOCKSTEP_ZERO_PREFETCH", None)
    if prefetch:
        env["LOCKSTEP_ZERO_PREFETCH"] = "1"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    s = json.loads(out.read_text())
    return s["wall_s"] / s["steps"], s["optimizer_state_bytes"], s["param_hash"]


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def compare_gathers(args, devices):
    """zero 1 both times: all-gathers waited at the end of the step against prefetched behind the
    next forward, alternating in pairs (which goes first alternates too)."""
    print("| workload | N | pairs | step ms end of step | step ms prefetch | prefetch / end "
          "(median of pair ratios) | pair ratios, quartiles | end of step, quartiles ms |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        for name, (config, overrides) in WORKLOADS.items():
            if args.only not in name:
                continue
            for n in devices:
                times = {False: [], True: []}
                ratios = []
                for k in range(args.rounds):
                    pair = {}
                    for prefetch in ((False, True) if k % 2 == 0 else (True, False)):
                        t, _, h = run(args.lockstep, config, overrides, n, 1, out, prefetch)
                        pair[prefetch] = (t, h)
                        times[prefetch].append(t)
                    if pair[False][1] != pair[True][1]:
                        raise SystemExit(f"{name} N={n}: parameter hashes differ")
                    ratios.append(pair[True][0] / pair[False][0])
                te, tp = statistics.median(times[False]), statistics.median(times[True])
                r = statistics.median(ratios)
                r1, r3 = quartiles(ratios)
                e1, e3 = quartiles(times[False])
                print(f"| {name} | {n} | {args.rounds} | {1e3 * te:.1f} | {1e3 * tp:.1f} | "
                      f"{r:.3f} | {r1:.3f}-{r3:.3f} | {1e3 * e1:.1f}-{1e3 * e3:.1f} |",
                      flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lockstep", default="build/lockstep")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--devices", default="2,4")
    ap.add_argument("--only", default="", help="the workloads whose name contains this")
    ap.add_argument("--gathers", action="store_true",
                    help="zero 1 only: all-gathers at the end of the step against prefetched")
    args = ap.parse_args()
    if args.gathers:
        return compare_gathers(args, [int(d) for d in args.devices.split(",")])
    print("| workload | N | step ms zero 0 | step ms zero 1 | zero 1 / zero 0 | "
          "state bytes/worker zero 0 | zero 1 |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        for name, (config, overrides) in WORKLOADS.items():
            for n in (int(d) for d in args.devices.split(",")):
                times = {0: [], 1: []}
                state = {}
                for _ in range(args.rounds):
                    for zero in (0, 1):
                        t, b, _ = run(args.lockstep, config, overrides, n, zero, out)
                        times[zero].append(t)
                        state[zero] = b
                t0, t1 = statistics.median(times[0]), statistics.median(times[1])
                print(f"| {name} | {n} | {1e3 * t0:.1f} | {1e3 * t1:.1f} | {t1 / t0:.2f} | "
                      f"{state[0]} | {state[1]} |", flush=True)


if __name__ == "__main__":
    main()
