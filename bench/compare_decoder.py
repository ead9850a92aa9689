#!/usr/bin/env python3
"""Llama-family training step: lockstep against transformers' LlamaForCausalLM, side by side.

    bench/compare_decoder.py [--config configs/smollm2_135m.yaml] [--context 256] [--batch 2]
                             [--pairs 3] [--steps 4] [--warmup 2] [--threads 0]
                             [--precisions fp32,bf16] [--layers N] [--python PY] [--build BUILD]

The model is the config's (SmolLM2-135M's shape by default: 30 layers of 576 channels, 9 query
heads on 3 kv heads, SwiGLU of 1536, tied embeddings, vocabulary 49,152), at a context and batch
that fit a small CPU (--layers keeps the first N layers, to shorten a run). Round-robin, --pairs
times, so every run sees the same machine load:
  - `lockstep train CONFIG` at each precision (fp32, bf16), one device with every hardware
    thread, AdamW, windows of random tokens; step times from its metrics stream;
  - bench/decoder_torch.py in the interop venv (transformers 4.40.2 on Debian's PyTorch): the
    same shape as LlamaForCausalLM, AdamW, the same batch; fp32, and bf16 under
    torch.autocast with fp32 master weights; PyTorch given every thread.
Reports each run's median step time and tokens/s, and lockstep's speedup (PyTorch's step time
over lockstep's) at each precision. The timed steps follow --warmup untimed ones.
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


def model_keys(config):
    """The model section of a lockstep config, as {key: value} (flat; rope_scaling left out)."""
    import yaml
    with open(config) as f:
        return yaml.safe_load(f)["model"]


def run_lockstep(cli, config, folder, args, precision):
    """Median step time of `cli train CONFIG` at `precision` after the warmup steps."""
    metrics = os.path.join(folder, f"metrics_{precision}.jsonl")
    summary = os.path.join(folder, f"summary_{precision}.json")
    for stale in (metrics, summary):
        if os.path.exists(stale):
            os.remove(stale)
    sets = {"model.context": args.context, "data.path": os.path.join(folder, "tokens.bin"),
            "data.format": "raw", "data.eval_path": "null", "data.eval_fraction": 0.0,
            "data.batch_size": args.batch, "data.shuffle": "false", "schedule.type": "constant",
            "trainer.backend": "cpu", "trainer.devices": 1,
            "trainer.threads_per_device": args.threads, "trainer.steps": args.warmup + args.steps,
            "trainer.log_every": 1, "trainer.eval_every": 0, "trainer.check_replicas_every": 0,
            "trainer.precision": precision, "trainer.metrics": metrics,
            "trainer.checkpoint.dir": "null"}
    if args.layers:
        sets["model.n_layer"] = args.layers
    cmd = [cli, "train", config, "--summary-json", summary]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": ((done.stdout + done.stderr).strip().splitlines() or ["no output"])[-1]}
    with open(metrics) as f:
        elapsed = [json.loads(line)["elapsed_s"] for line in f if '"kind": "step"' in line]
    with open(summary) as f:
        s = json.load(f)
    step_s = statistics.median([b - a for a, b in zip(elapsed, elapsed[1:])][args.warmup - 1:])
    return {"step_ms": 1e3 * step_s, "tokens_per_s": args.batch * args.context / step_s,
            "params": s["parameters"]}


def run_torch(python, keys, args, precision):
    """bench/decoder_torch.py's JSON line; {"error": ...} when it fails."""
    cmd = [python, os.path.join(ROOT, "bench", "decoder_torch.py"), "--model",
           json.dumps(keys), "--context", str(args.context), "--batch", str(args.batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads",
           str(args.threads or os.cpu_count())]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    if precision == "bf16":
        cmd.append("--bf16")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": ((done.stdout + done.stderr).strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", help="a Python with transformers (default: the interop venv)")
    args = ap.parse_args()
    args.warmup = max(1, args.warmup)
    python = args.python or os.path.join(args.build, "python-hf", "bin", "python")
    keys = model_keys(args.config)
    precisions = args.precisions.split(",")
    names = [(f, p) for p in precisions for f in ("lockstep", "torch")]
    import numpy as np
    from compare_gpt import round_robin
    with tempfile.TemporaryDirectory() as folder:
        windows = (args.warmup + args.steps) * args.batch + 1
        np.random.default_rng(0).integers(0, keys["vocab_size"], windows * args.context + 1) \
            .astype("<u2").tofile(os.path.join(folder, "tokens.bin"))
        runs, errors = round_robin(names, args.pairs, lambda framework, precision: (
            run_lockstep(os.path.join(args.build, "lockstep"), args.config, folder, args,
                         precision) if framework == "lockstep"
            else run_torch(python, keys, args, precision)))
    ms = {k: statistics.median(r["step_ms"] for r in rows) for k, rows in runs.items() if rows}
    params = next((rows[0]["params"] for rows in runs.values() if rows), "?")
    print(f"\n{os.path.basename(args.config)}, {params} parameters, batch {args.batch} x context "
          f"{args.context}, {args.pairs} rounds of {args.steps} timed steps (medians)")
    print(f"{'framework':<12} {'precision':<16} {'step ms':>9} {'tokens/s':>9}")
    for k in names:
        if k in ms:
            label = "bf16 (autocast)" if k == ("torch", "bf16") else k[1]
            print(f"{k[0]:<12} {label:<16} {ms[k]:>9.0f} "
                  f"{args.batch * args.context / ms[k] * 1e3:>9.0f}")
    for p in precisions:
        a, b = ("lockstep", p), ("torch", p)
        print(f"lockstep speedup over transformers, {p}: "
              + (f"{ms[b] / ms[a]:.2f}x" if a in ms and b in ms else "n/a"))
    for (framework, precision), error in errors.items():
        print(f"{framework} {precision}: not measured: {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
