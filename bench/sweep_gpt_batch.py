#!/usr/bin/env python3
"""Which micro-batch trains GPT fastest on one device: lockstep's step time at several batch
sizes, one `lockstep train` run each (bench/compare_gpt.py's run_lockstep: the same config,
random tokens, AdamW, one device, step times from the metrics stream after --warmup steps).

    python3 bench/sweep_gpt_batch.py [--device cuda] [--preset 124m] [--precision bf16]
                                     [--batches 8,16,32,64] [--steps 8] [--warmup 2] [--csv F]

Prints one line per batch (step ms, tokens/s, MFU) and the fastest in tokens/s; a batch that
does not fit (lockstep's memory plan refuses it, or the run fails) is reported and skipped.
configs/gpt2_124m.yaml's batch_size comes from this on the GPU (issue 25, item 9).
"""

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "tests", "model")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--batches", default="8,16,32,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--csv")
    args = ap.parse_args()
    args.warmup = max(1, args.warmup)  # the first step's time includes the start-up
    args.tf32 = args.precision == "tf32"
    from compare_gpt import run_lockstep, write_random_tokens
    from gpt_torch import PRESETS
    preset = PRESETS[args.preset]
    batches = [int(b) for b in args.batches.split(",")]
    cli = os.path.join(args.build, "lockstep")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        windows = (args.warmup + args.steps) * max(batches) + 1
        write_random_tokens(folder, preset, windows)
        for batch in batches:
            args.batch = batch
            r = run_lockstep(cli, folder, preset, args,
                             "fp32" if args.precision == "tf32" else args.precision)
            if "error" in r:
                print(f"batch {batch}: not measured: {r['error']}", flush=True)
                continue
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            print(f"batch {batch}: {r['step_ms']:.1f} ms per step, {r['tokens_per_s']:.0f} "
                  f"tokens/s, MFU {mfu}", flush=True)
            rows.append((batch, r["step_ms"], r["tokens_per_s"], mfu))
    if not rows:
        print("no batch size ran")
        return 1
    best = max(rows, key=lambda row: row[2])
    print(f"fastest: batch {best[0]} x {preset['context']}, {best[2]:.0f} tokens/s "
          f"({args.preset}, {args.precision}, {args.device})")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("batch,step_ms,tokens_per_s,mfu\n")
            for batch, ms, tps, mfu in rows:
                f.write(f"{batch},{ms:.3f},{tps:.1f},{mfu}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
