#!/usr/bin/python3
"""Scaling of the CPU backend at N = 1, 2, 4 workers against the ideal (time / N), as pictures.

Runs build/bench/bench_overlap (a deep MLP whose all-reduce runs over an emulated interconnect,
overlap off and on) and, with --train, build/bench/bench_train (the real shared-memory
all-reduce, no emulation), prints their tables as they come, and draws speedup and efficiency
against the ideal from their CSVs.

    /usr/bin/python3 bench/scaling.py [--runs 3] [--steps 60] [--train] [--out build/bench/scaling]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import svg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "bench")


def read_csv(path: str) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def speedup_charts(title: str, groups: dict) -> list:
    """groups: name -> [(workers, speedup)]; one speedup chart and one efficiency chart."""
    workers = sorted({n for pts in groups.values() for n, _ in pts})
    lines = [svg.Line(name, [n for n, _ in pts], [s for _, s in pts]) for name, pts in groups.items()]
    ideal = svg.Line("ideal (time / N)", workers, [float(n) for n in workers], dashed=True,
                     color="#888")
    ticks = [(n, str(n)) for n in workers]
    eff = [svg.Line(name, [n for n, _ in pts], [100.0 * s / n for n, s in pts])
           for name, pts in groups.items()]
    return [svg.line_chart(f"{title}: speedup", lines + [ideal], "workers (N)",
                           "speedup over N = 1", x_ticks=ticks),
            svg.line_chart(f"{title}: efficiency", eff + [svg.Line(
                "ideal", workers, [100.0] * len(workers), dashed=True, color="#888")],
                "workers (N)", "efficiency (%)", x_ticks=ticks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--train", action="store_true", help="also run bench_train")
    ap.add_argument("--train-runs", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(BENCH, "scaling"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    overlap_csv = os.path.join(args.out, "overlap.csv")
    subprocess.run([os.path.join(BENCH, "bench_overlap"), "--runs", str(args.runs), "--steps",
                    str(args.steps), "--csv", overlap_csv], check=True)
    rows = read_csv(overlap_csv)
    groups = {}
    for r in rows:
        groups.setdefault(f"overlap {r['overlap']}", []).append(
            (int(r["workers"]), float(r["speedup"])))
    charts = speedup_charts("bench_overlap (emulated link)", groups)
    hidden = {}
    for r in rows:
        hidden.setdefault(f"overlap {r['overlap']}", []).append(
            (int(r["workers"]), 100.0 * float(r["hidden_fraction"])))
    charts.append(svg.line_chart(
        "bench_overlap: all-reduce hidden behind backward",
        [svg.Line(k, [n for n, _ in v], [h for _, h in v]) for k, v in hidden.items()],
        "workers (N)", "hidden (%)", x_ticks=[(n, str(n)) for n in sorted({n for v in hidden.values() for n, _ in v})]))
    svg.save(os.path.join(args.out, "overlap.svg"), charts, columns=3,
             title=f"bench_overlap: deep MLP 8x512, batch 64/worker, 1 thread/worker, "
                   f"median of {args.runs} runs")
    written = ["overlap.csv", "overlap.svg"]

    if args.train:
        train_csv = os.path.join(args.out, "train.csv")
        subprocess.run([os.path.join(BENCH, "bench_train"), "--runs", str(args.train_runs),
                        "--steps", str(args.train_steps), "--csv", train_csv], check=True)
        groups = {}
        for r in read_csv(train_csv):
            groups.setdefault(r["workload"], []).append((int(r["workers"]), float(r["speedup"])))
        svg.save(os.path.join(args.out, "train.svg"), speedup_charts("bench_train", groups),
                 columns=2, title=f"bench_train: shared-memory all-reduce, no emulation, "
                                  f"{os.cpu_count()} cores, median of {args.train_runs} runs")
        written += ["train.csv", "train.svg"]
    print(f"\nwrote {', '.join(os.path.join(args.out, w) for w in written)}")


if __name__ == "__main__":
    main()
