#!/usr/bin/python3
"""lockstep's shared-memory all-reduce against gloo's and against memcpy, in one table.

Runs build/bench/bench_allreduce (lockstep's communicator, and one thread's memcpy of the same
bytes) and bench/allreduce_gloo.py (torch.distributed, gloo), alternating them for --rounds
rounds, and prints the median of each column per (ranks, size): busbw = algbw * 2(n-1)/n as in
nccl-tests, memcpy GB/s, and the ratios lockstep/memcpy and lockstep/gloo. Writes a CSV and an
SVG (busbw against size, log x), and checks the targets for buffers >= 16 MB: lockstep busbw
>= 70% of memcpy and >= 5x gloo.

    /usr/bin/python3 bench/compare_allreduce.py [--max-mb 256] [--reps 20] [--rounds 1]
        [--ranks 2,4] [--bench build/bench/bench_allreduce] [--out build/bench/allreduce]
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allreduce_gloo  # noqa: E402
import svg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_csv(path: str) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_allreduce"))
    ap.add_argument("--max-mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ranks", default="2,4", help="gloo ranks; bench_allreduce runs 2 and 4")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "allreduce"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ranks = [int(v) for v in args.ranks.split(",")]

    # (ranks, bytes) -> column -> values over rounds
    cols: dict = {}
    for r in range(args.rounds):
        path = os.path.join(args.out, f"lockstep_round{r}.csv")
        print(f"round {r + 1}/{args.rounds}: {args.bench}", flush=True)
        subprocess.run([args.bench, "--reps", str(args.reps), "--max-mb", str(args.max_mb),
                        "--csv", path], check=True)
        for row in read_csv(path):
            key = (int(row["ranks"]), int(row["bytes"]))
            c = cols.setdefault(key, {"lockstep": [], "memcpy": [], "gloo": []})
            c["lockstep"].append(float(row["busbw_gbs"]))
            c["memcpy"].append(float(row["memcpy_gbs"]))
        print(f"round {r + 1}/{args.rounds}: gloo, ranks {args.ranks}", flush=True)
        for n, nbytes, t in allreduce_gloo.measure(ranks, args.max_mb, args.reps):
            busbw = nbytes / t / 1e9 * 2 * (n - 1) / n
            cols.setdefault((n, nbytes), {"lockstep": [], "memcpy": [], "gloo": []})["gloo"].append(busbw)

    rows = []
    for (n, nbytes), c in sorted(cols.items()):
        if not c["lockstep"] or not c["gloo"]:
            continue
        ls, gl, mc = (statistics.median(c[k]) for k in ("lockstep", "gloo", "memcpy"))
        rows.append({"ranks": n, "bytes": nbytes, "lockstep_busbw_gbs": ls, "gloo_busbw_gbs": gl,
                     "memcpy_gbs": mc, "lockstep_over_memcpy": ls / mc, "lockstep_over_gloo": ls / gl})

    print(f"\nmedians over {args.rounds} round(s); busbw = algbw * 2(n-1)/n; memcpy = one thread\n")
    print(f"{'ranks':>5} {'size':>6} {'lockstep busbw':>14} {'gloo busbw':>10} {'memcpy':>8} "
          f"{'ls/memcpy':>9} {'ls/gloo':>8}")
    for r in rows:
        print(f"{r['ranks']:>5} {svg.fmt_bytes(r['bytes']):>6} {r['lockstep_busbw_gbs']:>14.2f} "
              f"{r['gloo_busbw_gbs']:>10.2f} {r['memcpy_gbs']:>8.2f} "
              f"{r['lockstep_over_memcpy']:>9.2f} {r['lockstep_over_gloo']:>8.1f}")
    big = [r for r in rows if r["bytes"] >= 16 << 20]
    if big:
        worst_mem = min(big, key=lambda r: r["lockstep_over_memcpy"])
        worst_gloo = min(big, key=lambda r: r["lockstep_over_gloo"])
        print(f"\ntargets for buffers >= 16 MB:"
              f"\n  lockstep busbw >= 70% of memcpy: "
              f"{'met' if worst_mem['lockstep_over_memcpy'] >= 0.7 else 'MISSED'} "
              f"(lowest {worst_mem['lockstep_over_memcpy']:.0%}, {worst_mem['ranks']} ranks, "
              f"{svg.fmt_bytes(worst_mem['bytes'])})"
              f"\n  lockstep busbw >= 5x gloo: "
              f"{'met' if worst_gloo['lockstep_over_gloo'] >= 5 else 'MISSED'} "
              f"(lowest {worst_gloo['lockstep_over_gloo']:.1f}x, {worst_gloo['ranks']} ranks, "
              f"{svg.fmt_bytes(worst_gloo['bytes'])})")

    svg.save_rows(os.path.join(args.out, "compare_allreduce.csv"), rows)
    charts = []
    for n in sorted({r["ranks"] for r in rows}):
        sel = [r for r in rows if r["ranks"] == n]
        x = [r["bytes"] for r in sel]
        charts.append(svg.line_chart(
            f"all-reduce, {n} ranks", [
                svg.Line("lockstep busbw", x, [r["lockstep_busbw_gbs"] for r in sel]),
                svg.Line("gloo busbw", x, [r["gloo_busbw_gbs"] for r in sel]),
                svg.Line("memcpy (1 thread)", x, [r["memcpy_gbs"] for r in sel], dashed=True,
                         color="#888")],
            x_label="buffer size (bytes)", y_label="GB/s", log_x=True,
            x_ticks=[(b, svg.fmt_bytes(b)) for b in x]))
    svg.save(os.path.join(args.out, "compare_allreduce.svg"), charts, columns=2,
             title=f"all-reduce bandwidth: lockstep shared memory vs gloo vs memcpy "
                   f"(median of {args.rounds} round(s))")
    print(f"\nwrote {args.out}/compare_allreduce.csv, compare_allreduce.svg")


if __name__ == "__main__":
    main()
