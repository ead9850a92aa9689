#!/usr/bin/python3
"""The memory plan against the device's measured memory, and the step time, across
trainer.recompute on one GPU (issue 45; scripts/gpu_check.py's memory phase).

GPT-2 124M (configs/gpt2_124m.yaml) at B --batch x T 1024, bf16, fused attention (cuDNN), AdamW,
one worker on GPU 0: one short `lockstep train` per recompute mode (none, selective, full), then,
while --deadline-s allows, 2 peer replicas of GPU 0 with trainer.zero 0 and 2 (recompute full),
the ZeRO setting one GPU can show, and one worker with a one-rank NCCL communicator (trainer.comm
nccl), which trainer.comm auto no longer makes for one worker. For each run:
  - the plan (the summary's activation_bytes and planned_worker_bytes: Trainer::memory_plan(),
    which --dry-run prints), times the workers on the GPU;
  - measured: what the run added to the GPU as its driver counts it, the summary's
    device_memory peak_bytes - baseline_bytes (Note [Device memory measured] in
    src/train/device_memory.hpp), and its ratio to the plan (goal: within 10%);
  - the baseline (the CUDA context, and whatever else was on the GPU);
  - the check from outside: NVML's memory.used (nvidia-smi, every 100 ms through the run) at its
    most, less the driver's peak (both the whole GPU's use): a constant near 0 from run to run
    (NVML counts the driver's reserved memory apart), unless something was in use between the
    trainer's two samples;
  - the median step time after --warmup steps (elapsed_s of trainer.metrics), and its cost
    against none (goals: selective <= +8%, full <= +35%).
Prints a Markdown table, then lines `device_memory: ...` (the figures gpu_check reads).

    bench/device_memory.py --build build-gpu                         # on a GPU
    bench/device_memory.py --build build --device cpu --config configs/gpt_tiny.yaml --batch 2 \
        --set data.dataset=tokens --set model.vocab_size=50257     # here: peak RSS measured

On the CPU the measured column is the process's peak RSS (the summary's peak_rss_bytes), which
holds the dataset and the program too: a check that the script runs, not a measurement.
Only the standard library is used.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_table import token_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = ("none", "selective", "full")
GIB = 2**30


def run(args, name, data, folder, sets, timeout_s):
    """One `lockstep train`: its summary, median step seconds and NVML peak (MiB, or None);
    {"error": ...} when it fails."""
    summary = Path(folder) / f"{name}.json"
    metrics = Path(folder) / f"{name}.jsonl"
    for stale in (summary, metrics):
        stale.unlink(missing_ok=True)
    cmd = [os.path.join(args.build, "lockstep"), "train", str(ROOT / args.config)]
    overrides = [f"data.path={data}", "data.eval_path=null", "data.eval_fraction=0",
                 f"trainer.backend={args.device}", "trainer.precision=bf16",
                 "model.attention=fused", f"data.batch_size={args.batch}",
                 f"trainer.steps={args.warmup + args.steps}", "trainer.log_every=1",
                 "trainer.eval_every=0", "trainer.check_replicas_every=0",
                 "trainer.checkpoint.dir=null", "schedule.warmup_steps=1",
                 f"trainer.metrics={metrics}", *args.set, *sets]
    for o in overrides:
        cmd += ["--set", o]
    cmd += ["--summary-json", str(summary)]
    poll = None
    if args.device == "cuda" and shutil.which("nvidia-smi"):
        poll_log = open(Path(folder) / f"{name}.nvml", "w")
        poll = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used",
                                 "--format=csv,noheader,nounits", "-i", "0", "-lms", "100"],
                                stdout=poll_log, stderr=subprocess.DEVNULL)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    finally:
        if poll:
            poll.terminate()
            poll.wait()
            poll_log.close()
    with open(Path(folder) / f"{name}.log", "w") as f:
        f.write(" ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        return {"error": f"exit {done.returncode}: {lines[-1] if lines else ''}"}
    s = json.loads(summary.read_text())
    elapsed = [json.loads(line)["elapsed_s"] for line in metrics.read_text().splitlines()
               if json.loads(line).get("kind") == "step"]
    # elapsed[i]: the end of step i + 1; steps warmup + 1 onwards are timed.
    timed = elapsed[args.warmup - 1:]
    step_s = statistics.median(b - a for a, b in zip(timed, timed[1:]))
    nvml = None
    if poll:
        values = [float(v) for v in (Path(folder) / f"{name}.nvml").read_text().split()
                  if v.replace(".", "", 1).isdigit()]
        nvml = max(values) if values else None
    return {"summary": s, "step_s": step_s, "nvml_mib": nvml}


def measured_bytes(s):
    """(what the run added: device peak - baseline, or on the CPU the peak RSS; the baseline;
    the device's peak), GPU 0's."""
    gpus = [g for g in s.get("device_memory") or [] if g["device"] == 0]
    if gpus:
        g = gpus[0]
        return g["peak_bytes"] - g["baseline_bytes"], g["baseline_bytes"], g["peak_bytes"]
    return s["peak_rss_bytes"], None, None


def gib(x):
    return "-" if x is None else f"{x / GIB:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build-gpu"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--config", default="configs/gpt2_124m.yaml")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=90.0,
                    help="start no run that could end after this many seconds")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (repeatable)")
    ap.add_argument("--logs", help="a folder to copy each run's log and summary into")
    args = ap.parse_args()
    start = time.monotonic()
    rows = []  # (name, workers, result)
    with tempfile.TemporaryDirectory() as folder:
        context = 1024
        windows = (args.warmup + args.steps + 2) * args.batch * 2
        data = token_file(folder, windows * (context + 1) + 1, 50257)
        plans = [(f"recompute {m}", 1, [f"trainer.recompute={m}", "trainer.devices=[0]"])
                 for m in MODES]
        plans += [(f"zero {z}, N 2, full", 2, ["trainer.recompute=full", f"trainer.zero={z}",
                                             "trainer.devices=[0,0]", "trainer.comm=peer"]
                   if args.device == "cuda" else
                   ["trainer.recompute=full", f"trainer.zero={z}", "trainer.devices=2",
                    "trainer.threads_per_device=1"])
                  for z in (0, 2)]
        if args.device == "cuda":
            # One worker's communicator: trainer.comm auto gives it the peer group of one rank
            # (a few events); nccl makes a one-rank NCCL communicator, which the plan leaves out:
            # 1.06 GiB on the H200 (bench/GPU.md, 2026-12-04), for collectives that move
            # nothing. This row keeps that cost in view beside auto's rows.
            plans.append(("comm nccl, recompute full", 1,
                          ["trainer.recompute=full", "trainer.devices=[0]", "trainer.comm=nccl"]))
        longest = 0.0
        for name, workers, sets in plans:
            left = args.deadline_s - (time.monotonic() - start)
            if left < max(5.0, 1.5 * longest * workers):
                print(f"device_memory: {name}: not run ({left:.0f} s left)", flush=True)
                continue
            t0 = time.monotonic()
            r = run(args, name.replace(" ", "_").replace(",", ""), data, folder, sets, left)
            longest = max(longest, (time.monotonic() - t0) / workers)
            rows.append((name, workers, r))
            if "error" in r:
                print(f"device_memory: {name}: FAILED: {r['error']}", flush=True)
        for name in os.listdir(folder) if args.logs else []:  # gpu_check's archive
            if name.endswith((".log", ".json")):
                shutil.copy(os.path.join(folder, name),
                            os.path.join(args.logs, "device_memory_" + name))
    report(args, rows)
    return 1 if any("error" in r for _, _, r in rows) or not rows else 0


def report(args, rows):
    what = "device peak - baseline" if args.device == "cuda" else "peak RSS"
    print(f"\n## Memory plan against the measured memory, {args.config}, B {args.batch}, bf16, "
          f"fused attention, {args.device}\n")
    print(f"| run | plan: activations GiB | plan: total GiB (x workers) | measured: {what} GiB | "
          "measured / plan | baseline GiB | NVML peak - driver's MiB | step ms | cost vs none |")
    print("|---|---|---|---|---|---|---|---|---|")
    none_s = next((r["step_s"] for n, _, r in rows if n == "recompute none" and "step_s" in r),
                  None)
    lines = []
    for name, workers, r in rows:
        if "error" in r:
            print(f"| {name} | failed: {r['error']} |||||||")
            continue
        s = r["summary"]
        plan = s["planned_worker_bytes"] * workers
        got, baseline, peak = measured_bytes(s)
        nvml = None
        if r["nvml_mib"] is not None and peak is not None:
            nvml = r["nvml_mib"] - peak / 2**20
        cost = (r["step_s"] / none_s - 1) if none_s and name.startswith("recompute") else None
        ratio = got / plan if plan else float("nan")
        print(f"| {name} | {gib(s['activation_bytes'])} | {gib(plan)} | {gib(got)} | "
              f"{ratio:.3f} | {gib(baseline)} | {'-' if nvml is None else f'{nvml:+.0f}'} | "
              f"{1e3 * r['step_s']:.1f} | "
              f"{'-' if cost is None else f'{100 * cost:+.1f}%'} |")
        goal = ""
        if args.device == "cuda" and not name.startswith("comm nccl"):
            goal = " (goal within 10%: " + ("met" if abs(ratio - 1) <= 0.1 else "NOT MET") + ")"
        elif args.device == "cuda":  # a reference: the one-rank communicator auto does not make
            goal = " (NCCL's one-rank communicator, which the plan leaves out)"
        line = (f"{name}: plan {gib(plan)} GiB, measured {gib(got)} GiB = {ratio:.3f}x{goal}, "
                f"{1e3 * r['step_s']:.1f} ms/step")
        if s.get("communicator"):
            line += f" ({s['communicator'].split(':')[0]})"
        if cost is not None and name != "recompute none":
            bound = 0.08 if "selective" in name else 0.35
            line += (f" ({100 * cost:+.1f}% vs none, goal <= +{100 * bound:.0f}%: "
                     + ("met" if cost <= bound else "NOT MET") + ")")
        if nvml is not None:
            line += f"; NVML {nvml:+.0f} MiB against the driver's peak"
        lines.append(line)
    print()
    for line in lines:
        print("device_memory: " + line)


if __name__ == "__main__":
    sys.exit(main())
