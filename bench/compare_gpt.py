#!/usr/bin/env python3
"""GPT training step: lockstep against PyTorch eager, side by side in one run.

    /usr/bin/python3 bench/compare_gpt.py [--pairs 5] [--preset tiny] [--batch 16] [--steps 10]
                                          [--device cpu|cuda] [--tf32] [--threads T] [--csv FILE]
                                          [--precision bf16 [--peak-tflops P] [--before BUILD]
                                           [--torch-best]]

Runs build/bench/bench_gpt and bench/gpt_torch.py alternately, --pairs times each (so both see
the same machine load), with the same model (configs/gpt_tiny.yaml's shapes for --preset tiny,
GPT-2 small for 124m), the same batch of windows, AdamW, one device. Reports each framework's
median step time and tokens/s over the pairs, and lockstep's speedup (PyTorch step time /
lockstep step time). On a GPU, also lockstep's MFU. Prints a table; --csv also writes it.

--precision bf16 (issue 16) compares four runs, round-robin --pairs times: lockstep with
trainer.precision fp32 and bf16, both through `lockstep train` (a config the script writes: the
preset's model, a file of random tokens, AdamW, one device, the step times from its metrics
stream, so the two share every cost but the precision), and PyTorch fp32 and bf16 under
torch.autocast (bench/gpt_torch.py --bf16). It prints the medians, and the ratios: each
framework's bf16 speedup over its fp32, and lockstep's over PyTorch at each precision. MFU
uses lockstep's flops per token (--summary-json) and lockstep's peak table, or --peak-tflops
where the table has none (bf16). A lockstep run that fails (a build without bf16) is reported
and the others still run; the exit status is then 1.

--torch-best (with --precision bf16, PyTorch 2) adds PyTorch at its best to the round-robin:
autocast bf16, scaled_dot_product_attention, fused AdamW and torch.compile (gpt_torch.py
--best), with its compile time reported apart, and lockstep bf16's speedup over it. Each of its
runs compiles again: --torch-best-rounds N keeps it to the first N rounds. --no-fp32 leaves the
fp32 runs out (the GPU check wants the bf16 figures only).

--before BUILD (with --precision bf16) adds the lockstep runs of another build, e.g. of the main
branch, to the round-robin, each just before the same run of --build, and reports --build's
speedup over it at each precision.
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


def run(cmd):
    """The JSON line `cmd` prints last; {"error": its last line of output} when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": ((done.stdout + done.stderr).strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_random_tokens(folder, preset, windows):
    """`folder`/tokens.bin, the file run_lockstep's configs read: `windows` windows of the
    preset's context (+ 1 token) of random uint16 tokens below its vocabulary, seed 0."""
    import numpy as np
    rng = np.random.default_rng(0)
    rng.integers(0, preset["vocab"], windows * preset["context"] + 1).astype("<u2").tofile(
        os.path.join(folder, "tokens.bin"))


def run_lockstep(cli, folder, preset, args, precision, attention="auto", graphs="auto"):
    """Median step time of `cli train` at `precision` (and model.attention `attention`,
    trainer.cuda_graphs `graphs`) after the warmup steps, as the fields of bench_gpt's JSON
    line with the summary's device_busy and cuda_graphs; {"error": ...} when the run fails."""
    from gpt_parity import lockstep_config  # the config the parity test trains with
    config = os.path.join(folder, f"{precision}.yaml")
    metrics = os.path.join(folder, f"metrics_{precision}.jsonl")
    summary = os.path.join(folder, "summary.json")
    for stale in (metrics, summary):  # the metrics stream appends
        if os.path.exists(stale):
            os.remove(stale)
    spec = {"vocab_size": preset["vocab"], "context": preset["context"],
            "n_layer": preset["n_layer"], "n_head": preset["n_head"], "d_model": preset["d_model"]}
    opt = {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    with open(config, "w") as f:
        f.write(lockstep_config(spec, opt, {
            "tokens": os.path.join(folder, "tokens.bin"), "batch": args.batch,
            "steps": args.warmup + args.steps, "backend": args.device, "threads": args.threads,
            "precision": "tf32" if precision == "fp32" and args.tf32 else precision,
            "metrics": metrics, "attention": attention, "cuda_graphs": graphs}))
    done = subprocess.run([cli, "train", config, "--summary-json", summary],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr).strip().splitlines()[-1]}
    with open(metrics) as f:
        elapsed = [json.loads(line)["elapsed_s"] for line in f if '"kind": "step"' in line]
    with open(summary) as f:
        s = json.load(f)
    # elapsed[i] is the time at the end of step i + 1: steps warmup + 1 onwards are timed.
    step_s = statistics.median([b - a for a, b in zip(elapsed, elapsed[1:])][args.warmup - 1:])
    tokens = args.batch * preset["context"]
    return {"framework": "lockstep", "precision": precision, "device": s["backend"],
            "params": s["parameters"], "context": preset["context"], "step_ms": 1e3 * step_s,
            "tokens_per_s": tokens / step_s, "flops_per_token": s["flops_per_token"],
            # The summary's mfu is the whole run's, its start included; this is the timed
            # steps' (the same peak and FLOPs per token, at their rate).
            "mfu": (s["mfu"] * tokens / step_s / s["tokens_per_s"]
                    if s.get("mfu") is not None and s.get("tokens_per_s") else None),
            "attention": s.get("attention"),
            "device_busy": s.get("device_busy"), "cuda_graphs": s.get("cuda_graphs"),
            "warnings": [l for l in done.stderr.splitlines() if "warning" in l]}


def round_robin(names, rounds, run_one, skip=lambda i, name: False):
    """run_one(framework, precision) for each (framework, precision) of `names` in turn,
    `rounds` times, so that every run sees the same machine load; a name whose run fails (its
    result has "error") is reported and not run again, and skip(round, name) leaves a run out.
    Prints each round's step times. Returns (runs: name -> results, errors: name -> message)."""
    runs = {name: [] for name in names}
    errors = {}
    for i in range(rounds):
        for name in names:
            if name in errors or skip(i, name):
                continue
            r = run_one(*name)
            if "error" in r:
                errors[name] = r["error"]
                print(f"{name[0]} {name[1]}: not measured: {r['error']}", flush=True)
                continue
            runs[name].append(r)
        print(f"round {i + 1}: " + ", ".join(
            f"{f} {p} {runs[(f, p)][-1]['step_ms']:.1f} ms" for f, p in names
            if (f, p) not in errors and len(runs[(f, p)]) > i), flush=True)
    return runs, errors


def bf16_main(args):
    """--precision bf16: lockstep fp32 and bf16 against PyTorch fp32 and autocast bf16."""
    from gpt_torch import PRESETS  # the presets of both benchmarks (imports torch)
    preset = PRESETS[args.preset]
    clis = {"before": os.path.join(args.before, "lockstep")} if args.before else {}
    clis["lockstep"] = os.path.join(args.build, "lockstep")
    torch_cmd = [sys.executable, os.path.join(ROOT, "bench", "gpt_torch.py"), "--device",
                 args.device, "--preset", args.preset, "--batch", str(args.batch), "--steps",
                 str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    if args.tf32:
        torch_cmd.append("--tf32")
    precisions = ("bf16",) if args.no_fp32 else ("fp32", "bf16")
    names = [(f, p) for p in precisions for f in clis] + [("torch", p) for p in precisions]
    if args.torch_best:
        names.append(("torch", "best"))
    with tempfile.TemporaryDirectory() as folder:
        windows = (args.warmup + args.steps) * args.batch + 1
        write_random_tokens(folder, preset, windows)

        def run_one(framework, precision):
            if framework in clis:
                return run_lockstep(clis[framework], folder, preset, args, precision)
            return run(torch_cmd + {"fp32": [], "bf16": ["--bf16"], "best": ["--best"]}[precision])

        # PyTorch at its best compiles each time: the first --torch-best-rounds rounds only.
        runs, errors = round_robin(names, args.pairs, run_one, lambda i, name: (
            name[1] == "best" and i >= args.torch_best_rounds))
    return report_bf16(args, names, runs, errors)


def report_bf16(args, names, runs, errors):
    med = lambda rows, key: statistics.median(r[key] for r in rows)
    flops = [r["flops_per_token"] for rows in runs.values() for r in rows if "flops_per_token" in r]
    ms = {k: med(rows, "step_ms") for k, rows in runs.items() if rows}
    rows = []
    for k in names:
        if k not in ms:
            continue
        tps = med(runs[k], "tokens_per_s")
        mfu = [r["mfu"] for r in runs[k] if r.get("mfu") is not None]
        if mfu:
            m = f"{100 * statistics.median(mfu):.1f}%"
        elif args.peak_tflops and flops and k[1] in ("bf16", "best"):  # the peak is bf16's
            m = f"{100 * flops[0] * tps / (args.peak_tflops * 1e12):.1f}%"
        else:
            m = "-"
        name = {"lockstep": "lockstep", "before": "lockstep (before)"}.get(
            k[0], runs[k][0]["framework"])
        label = {("torch", "bf16"): "bf16 (autocast)",
                 ("torch", "best"): "bf16 best"}.get(k, k[1])
        rows.append((name, label, runs[k][0]["device"], ms[k], tps, m))
    first = next(rows for rows in runs.values() if rows)[0]
    print(f"\npreset {args.preset}, {first['params']} parameters, batch {args.batch} x context "
          f"{first['context']}, {args.pairs} rounds of {args.steps} timed steps (medians)")
    print(f"{'framework':<18} {'precision':<16} {'device':<14} {'step ms':>9} {'tokens/s':>10} "
          f"{'mfu':>6}")
    for name, label, dev, step_ms, tps, m in rows:
        print(f"{name:<18} {label:<16} {dev:<14} {step_ms:>9.1f} {tps:>10.0f} {m:>6}")
    ratio = lambda a, b: f"{ms[b] / ms[a]:.2f}x" if a in ms and b in ms else "n/a"
    print(f"bf16 speedup over fp32: lockstep {ratio(('lockstep', 'bf16'), ('lockstep', 'fp32'))}, "
          f"PyTorch {ratio(('torch', 'bf16'), ('torch', 'fp32'))}")
    print(f"lockstep speedup over PyTorch: fp32 {ratio(('lockstep', 'fp32'), ('torch', 'fp32'))}, "
          f"bf16 {ratio(('lockstep', 'bf16'), ('torch', 'bf16'))}")
    if ("torch", "best") in ms:
        compile_s = statistics.median(r["compile_s"] for r in runs[("torch", "best")])
        print(f"lockstep bf16 / PyTorch at its best (bf16 autocast, scaled_dot_product_attention, "
              f"fused AdamW, torch.compile; compile {compile_s:.1f} s, excluded): "
              f"{ratio(('lockstep', 'bf16'), ('torch', 'best'))}")
    if args.before:
        # Each round's two runs ran back to back: the median of their ratios is steadier under a
        # changing load than the ratio of the medians.
        def paired(p):
            pairs = list(zip(runs[("before", p)], runs[("lockstep", p)]))
            if not pairs or len(runs[("before", p)]) != len(runs[("lockstep", p)]):
                return "n/a"
            return f"{statistics.median(b['step_ms'] / a['step_ms'] for b, a in pairs):.2f}x"
        print(f"speedup over --before: fp32 {ratio(('lockstep', 'fp32'), ('before', 'fp32'))}, "
              f"bf16 {ratio(('lockstep', 'bf16'), ('before', 'bf16'))} (ratio of the medians); "
              f"fp32 {paired('fp32')}, bf16 {paired('bf16')} (median of the rounds' ratios)")
    for (framework, precision), error in errors.items():
        print(f"{framework} {precision}: not measured: {error}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("framework,precision,device,preset,batch,step_ms,tokens_per_s,mfu\n")
            for name, label, dev, step_ms, tps, m in rows:
                f.write(f"{name},{label},{dev},{args.preset},{args.batch},{step_ms:.3f},"
                        f"{tps:.1f},{m}\n")
    return 1 if errors else 0


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
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: lockstep fp32 and bf16 beside PyTorch fp32 and autocast bf16")
    ap.add_argument("--peak-tflops", type=float,
                    help="the device's peak, for MFU where lockstep's table has none (bf16)")
    ap.add_argument("--before", help="with --precision bf16: a second build's lockstep runs too")
    ap.add_argument("--torch-best", action="store_true",
                    help="with --precision bf16: PyTorch with SDPA, fused AdamW, torch.compile")
    ap.add_argument("--torch-best-rounds", type=int, default=1 << 30,
                    help="with --torch-best: run PyTorch at its best in the first N rounds only "
                         "(each run compiles the model again; scripts/gpu_check.py uses 1)")
    ap.add_argument("--no-fp32", action="store_true",
                    help="with --precision bf16: leave out both frameworks' fp32 runs")
    args = ap.parse_args()
    if (args.before or args.torch_best or args.no_fp32) and args.precision != "bf16":
        ap.error("--before, --torch-best and --no-fp32 need --precision bf16")
    if args.precision == "bf16":
        args.warmup = max(1, args.warmup)  # the first step's time includes the start-up
        return bf16_main(args)
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
        if "error" in theirs[-1]:
            print(f"PyTorch: {theirs[-1]['error']}")
            return 1
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
