#!/usr/bin/python3
"""Step time and optimiser-state bytes per worker, trainer.zero 0 against 1, on the CPU.

Runs `lockstep train` on each workload at each worker count, alternating zero 0 and zero 1 for
--rounds rounds, and prints a Markdown table of the median step time (wall time over steps,
from --summary-json) and the most optimiser-state bytes any worker holds.

    /usr/bin/python3 bench/compare_zero.py --rounds 3
"""
import argparse
import json
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


def run(lockstep, config, overrides, devices, zero, out):
    cmd = [lockstep, "train", config, "--summary-json", str(out)]
    for o in overrides + [f"trainer.devices={devices}", f"trainer.zero={zero}"]:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = json.loads(out.read_text())
    return s["wall_s"] / s["steps"], s["optimizer_state_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lockstep", default="build/lockstep")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--devices", default="2,4")
    ap.add_argument("--only", default="", help="the workloads whose name contains this")
    args = ap.parse_args()
    print("| workload | N | step ms zero 0 | step ms zero 1 | zero 1 / zero 0 | "
          "state bytes/worker zero 0 | zero 1 |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        for name, (config, overrides) in WORKLOADS.items():
            if args.only not in name:
                continue
            for n in (int(d) for d in args.devices.split(",")):
                times = {0: [], 1: []}
                state = {}
                for _ in range(args.rounds):
                    for zero in (0, 1):
                        t, b = run(args.lockstep, config, overrides, n, zero, out)
                        times[zero].append(t)
                        state[zero] = b
                t0, t1 = statistics.median(times[0]), statistics.median(times[1])
                print(f"| {name} | {n} | {1e3 * t0:.1f} | {1e3 * t1:.1f} | {t1 / t0:.2f} | "
                      f"{state[0]} | {state[1]} |", flush=True)


if __name__ == "__main__":
    main()
