#!/usr/bin/env python3
"""GPT training step: lockstep against PyTorch eager, side by side in one run.

    /usr/bin/python3 bench/compare_gpt.py [--pairs 5] [--preset tiny] [--batch 16] [--steps 10]
                                          [--device cpu|cuda] [--tf32] [--threads T] [--csv FILE]

Runs build/bench/bench_gpt and bench/gpt_torch.py alternately, --pairs times each (so both see
the same machine load), with the same model (configs/gpt_tiny.yaml's shapes for --preset tiny,
GPT-2 small for 124m), the same batch of windows, AdamW, one device. Reports each framework's
median step time and tokens/s over the pairs, and lockstep's speedup (PyTorch step time /
lockstep step time). On a GPU, also lockstep's MFU. Prints a table; --csv also writes it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--csv")
    args = ap.parse_args()
    common = ["--preset", args.preset, "--batch", str(args.batch), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--threads", str(args.threads)]
    if args.tf32:
        common.append("--tf32")
    ours_cmd = [os.path.join(args.build, "bench", "bench_gpt"), "--backend", args.device] + common
    torch_cmd = [sys.executable, os.path.join(ROOT, "bench", "gpt_torch.py"), "--device",
                 args.device] + common
    ours, theirs = [], []
    for i in range(args.pairs):
        ours.append(run(ours_cmd))
        if "error" in ours[-1]:
            print(f"lockstep: {ours[-1]['error']}")
            return 1
        theirs.append(run(torch_cmd))
        print(f"pair {i + 1}: lockstep {ours[-1]['step_ms']:.1f} ms, "
              f"{theirs[-1]['framework']} {theirs[-1]['step_ms']:.1f} ms", flush=True)
    med = lambda rows, key: statistics.median(r[key] for r in rows)
    o_ms, t_ms = med(ours, "step_ms"), med(theirs, "step_ms")
    mfu = [r["mfu"] for r in ours if r.get("mfu") is not None]
    rows = [
        ("lockstep", ours[0]["device"], o_ms, med(ours, "tokens_per_s"),
         f"{100 * statistics.median(mfu):.1f}%" if mfu else "-"),
        (theirs[0]["framework"], args.device, t_ms, med(theirs, "tokens_per_s"), "-"),
    ]
    print(f"\npreset {args.preset}, {ours[0]['params']} parameters, batch {args.batch} x context "
          f"{ours[0]['context']}, {args.pairs} pairs of {args.steps} timed steps (medians)")
    print(f"{'framework':<18} {'device':<14} {'step ms':>9} {'tokens/s':>10} {'mfu':>6}")
    for name, dev, ms, tps, m in rows:
        print(f"{name:<18} {dev:<14} {ms:>9.1f} {tps:>10.0f} {m:>6}")
    print(f"lockstep speedup over PyTorch eager: {t_ms / o_ms:.2f}x")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("framework,device,preset,batch,step_ms,tokens_per_s,speedup,mfu\n")
            for name, dev, ms, tps, m in rows:
                f.write(f"{name},{dev},{args.preset},{args.batch},{ms:.3f},{tps:.1f},"
                        f"{t_ms / ms:.3f},{m}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
