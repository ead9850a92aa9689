#!/usr/bin/env python3
"""What device graphs save a training step (issue 25 item 6; Note [Step graphs] in
src/train/step_graphs.hpp).

Runs `lockstep train` on a GPT preset with trainer.cuda_graphs off and on, alternately,
--pairs times (so both see the same machine load): the same config, random tokens and steps as
bench/compare_gpt.py's lockstep runs. Reports each mode's median step time after the warm-up
steps, tokens/s, the summary's device_busy (the share of a step the GPU was busy: Note [Device
step time]), the speedup with graphs, and what the run with graphs said of them (captured,
launches, or why it did not use them). With --auto, also one run of trainer.cuda_graphs: auto
long enough to time both ways, and its choice.

    bench/graph_step.py --build build --device cuda --preset 124m --batch 8 --precision bf16
    bench/graph_step.py --build build --device cpu --preset tiny   (graphs: off, and why)
"""
import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "bench")]

from compare_gpt import run_lockstep, write_random_tokens  # noqa: E402
from snapshot_cost import PRESETS  # noqa: E402


def describe(graphs):
    if not graphs:
        return "no cuda_graphs in the summary"
    if graphs["used"]:
        return "used: %d captured, %d launches" % (graphs["captured"], graphs["launched"])
    return "not used: " + (graphs["why_not"] or "nothing captured")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default="124m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--auto", action="store_true", help="also one run of cuda_graphs: auto")
    args = ap.parse_args()
    args.tf32 = False
    preset = PRESETS[args.preset]
    cli = os.path.join(args.build, "lockstep")
    runs = {"off": [], "on": []}
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        write_random_tokens(folder, preset, (args.warmup + 2 * args.steps + 20) * args.batch + 1)
        for _ in range(args.pairs):
            for mode in runs:
                r = run_lockstep(cli, folder, preset, args, args.precision, graphs=mode)
                if "error" in r:
                    print("cuda_graphs %s: FAILED: %s" % (mode, r["error"]))
                    failed = True
                else:
                    runs[mode].append(r)
        auto = None
        if args.auto:
            longer = argparse.Namespace(**{**vars(args), "steps": 2 * args.steps})
            auto = run_lockstep(cli, folder, preset, longer, args.precision, graphs="auto")
    print("%s, %s, batch %d x %d, %s; medians of %d runs of %d timed steps each"
          % (args.device, args.preset, args.batch, preset["context"], args.precision,
             args.pairs, args.steps))
    median = {}
    for mode, rs in runs.items():
        if not rs:
            continue
        median[mode] = statistics.median(r["step_ms"] for r in rs)
        busy = [r["device_busy"] for r in rs if r.get("device_busy") is not None]
        print("graph_step: cuda_graphs %-3s %8.2f ms/step %10.0f tokens/s  device busy %s  (%s)"
              % (mode, median[mode], 1e3 * args.batch * preset["context"] / median[mode],
                 "%.1f%%" % (100 * statistics.median(busy)) if busy else "n/a",
                 describe(rs[-1].get("cuda_graphs"))))
    if "off" in median and "on" in median:
        print("graph_step: speedup with graphs %.3fx (off / on)" % (median["off"] / median["on"]))
    if auto is not None:
        if "error" in auto:
            print("graph_step: auto FAILED: %s" % auto["error"])
            failed = True
        else:
            g = auto.get("cuda_graphs") or {}
            print("graph_step: auto timed %s ms with graphs, %s ms without: %s"
                  % (g.get("graph_step_ms"), g.get("eager_step_ms"), describe(g)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
