#!/usr/bin/env python3
"""Where lockstep's MLP step loses to PyTorch's, op by op (issue 25 item 8).

Runs build/bench/bench_mlp_ops (lockstep's ops through the Device API) and
bench/gpu_mlp_torch.py --breakdown (the ops autograd and torch.optim.SGD run for the same MLP)
alternately, --pairs times, and prints each op's median time on both sides, PyTorch / lockstep
(above 1: lockstep faster), both sides' TFLOP/s for the products, and what each op adds to the
step's gap (lockstep's time less PyTorch's, summed over the step). The ops that lockstep runs
and PyTorch does not (zeroing the gradients, the gradient norm) show 0 on PyTorch's side.

    bench/mlp_breakdown.py --build build [--batch 256] [--sizes 1024,4096,4096,1024] [--tf32]
    bench/mlp_breakdown.py --build build --device cpu --batch 32 --sizes 64,256,256,64
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lines(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("%s failed: %s" % (cmd[0], (done.stdout + done.stderr).strip()[-400:]))
    out = done.stdout.strip()
    if out.startswith("no usable GPU"):
        return None, out
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")], None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sizes", default="1024,4096,4096,1024")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    a = ap.parse_args()
    common = ["--batch", str(a.batch), "--sizes", a.sizes, "--repeat", str(a.repeat), "--runs",
              str(a.runs)] + (["--tf32"] if a.tf32 else [])
    ours = [os.path.join(a.build, "bench", "bench_mlp_ops"), "--backend", a.device] + common
    theirs = [a.python, os.path.join(ROOT, "bench", "gpu_mlp_torch.py"), "--breakdown",
              "--device", a.device] + common
    times = {"lockstep": {}, "torch": {}}
    flops = {}
    order = []
    for _ in range(a.pairs):
        for name, cmd in (("lockstep", ours), ("torch", theirs)):
            rows, skipped = lines(cmd)
            if rows is None:
                print(skipped)
                return 0
            for r in rows:
                if r["op"] not in order:
                    order.append(r["op"])
                times[name].setdefault(r["op"], []).append(r["ms"])
                if r["tflops"] is not None:
                    flops.setdefault((name, r["op"]), []).append(r["tflops"])
    print("MLP %s, batch %d, fp32%s, %s; medians of %d pairs, each op %d calls x %d timings"
          % (a.sizes.replace(",", "-"), a.batch, " TF32" if a.tf32 else " (TF32 off)", a.device,
             a.pairs, a.repeat, a.runs))
    print("mlp_breakdown: %-43s %10s %10s %8s %14s %9s"
          % ("op (ms per call)", "lockstep", "torch", "ratio", "TFLOP/s l / t", "gap ms"))
    med = {k: {op: statistics.median(v) for op, v in d.items()} for k, d in times.items()}
    for op in order:
        l, t = med["lockstep"].get(op, 0.0), med["torch"].get(op, 0.0)
        tf = ["%.1f" % statistics.median(flops[(n, op)]) if (n, op) in flops else "-"
              for n in ("lockstep", "torch")]
        ratio = "%.2fx" % (t / l) if l > 0 and t > 0 else "-"
        print("mlp_breakdown: %-43s %10.4f %10.4f %8s %14s %9.4f"
              % (op[:43], l, t, ratio, " / ".join(tf), l - t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
