#!/usr/bin/python3
"""Memory per worker across trainer.recompute x trainer.zero x N (issue 45).

1. From the memory plan (`lockstep train --dry-run`): GPT-2 124M (configs/gpt2_124m.yaml) at
   B 8 x T 1024, bf16, fused attention, AdamW, as a Markdown table of activations, gradients,
   optimiser state and the total per worker, for recompute none/selective/full x zero 0/1/2 x
   N 1, 2, 4, 8. The plan needs no GPU: the backend is set to cpu, whose fused attention has the same
   saved values (the cuDNN workspace of a GPU run is left out).
2. The largest GPT-2-family model (d_model = 64 x n_head, n_head = n_layer, GPT-2's
   vocabulary, context 1024, B 8) whose plan fits in --budget-gib per worker at N 4 with
   zero 2 + recompute full, against zero 0 + recompute none.
3. Measured: the peak resident memory (ru_maxrss of the `lockstep train` process) of GPT-2
   124M at B --measure-batch x T 1024 (bf16, fused attention, one worker, 1 step) on the CPU for
   each recompute mode, against the plan's host bytes, and the drop from none against the
   plan's drop in activations.

    /usr/bin/python3 bench/memory_table.py [--lockstep build/lockstep] [--skip-measure]
"""
import argparse
import os
import re
import resource
import struct
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def token_file(directory, tokens, vocab):
    """An llm.c .bin file of `tokens` tokens below `vocab`."""
    path = Path(directory) / f"tokens_{tokens}.bin"
    header = struct.pack("<256i", 20240520, 1, tokens, *([0] * 253))
    body = struct.pack(f"<{tokens}H", *((i * 7) % vocab for i in range(tokens)))
    path.write_bytes(header + body)
    return path


def to_bytes(text):
    number, unit = text.split()
    return float(number) * UNITS[unit]


def plan(lockstep, data, overrides):
    cmd = [lockstep, "train", str(ROOT / "configs/gpt2_124m.yaml"), "--dry-run",
           "--set", f"data.path={data}", "--set", "data.eval_path=",
           "--set", "trainer.backend=cpu", "--set", "trainer.checkpoint.dir=",
           "--set", "model.attention=fused"]
    for o in overrides:
        cmd += ["--set", o]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    size = r"([\d.]+ [KMGT]?i?B)"
    m = re.search(rf"memory plan: {size} per worker \(parameters {size}, gradients {size}"
                  rf"[^,]*, optimizer {size}[^,]*, activations {size}", out)
    if r.returncode == 0 and m:
        return {"fits": True, "total": to_bytes(m[1]), "params": to_bytes(m[2]),
                "grads": to_bytes(m[3]), "opt": to_bytes(m[4]), "acts": to_bytes(m[5])}
    m = re.search(r"needs ([\d.]+ [KMGT]?i?B) per worker", out)
    if m:
        return {"fits": False, "total": to_bytes(m[1])}
    raise RuntimeError(f"{' '.join(cmd)}:\n{out}")


def gib(x):
    return f"{x / 2**30:.2f}"


def table(lockstep, data):
    print("## Memory plan per worker, GPT-2 124M, B 8 x T 1024, bf16, fused attention, AdamW\n")
    print("| recompute | zero | N | activations GiB | gradients GiB | optimizer GiB | total GiB |")
    print("|---|---|---|---|---|---|---|")
    for recompute in ("none", "selective", "full"):
        for zero in (0, 1, 2):
            for n in (1, 2, 4, 8):
                p = plan(lockstep, data, [f"trainer.recompute={recompute}", f"trainer.zero={zero}",
                                          f"trainer.devices={n}", "trainer.threads_per_device=1"])
                if not p["fits"]:
                    print(f"| {recompute} | {zero} | {n} | - | - | - | {gib(p['total'])} (over the host) |")
                    continue
                print(f"| {recompute} | {zero} | {n} | {gib(p['acts'])} | {gib(p['grads'])} | "
                      f"{gib(p['opt'])} | {gib(p['total'])} |")


def largest(lockstep, data, budget, settings):
    """The largest n_layer (= n_head, d_model 64 n_layer) whose plan per worker is within budget."""
    best = None
    for layers in range(12, 80):
        p = plan(lockstep, data, settings + [f"model.n_layer={layers}", f"model.n_head={layers}",
                                             f"model.d_model={64 * layers}", "trainer.devices=4",
                                             "trainer.threads_per_device=1"])
        if p["total"] > budget:
            break
        c = 64 * layers
        params = 50257 * c + 1024 * c + layers * (12 * c * c + 13 * c) + 2 * c
        best = (layers, c, params, p["total"])
    return best


def measured(lockstep, data, batch):
    print(f"\n## Measured peak resident memory on the CPU, GPT-2 124M, B {batch} x T 1024, bf16, "
          "fused attention, AdamW, 1 worker, 1 step\n")
    print("| recompute | peak RSS MiB | plan: host MiB | plan: activations MiB | "
          "RSS drop from none MiB | plan's drop MiB |")
    print("|---|---|---|---|---|---|")
    first = None
    for recompute in ("none", "selective", "full"):
        overrides = [f"data.path={data}", "data.eval_path=", "trainer.backend=cpu",
                     "trainer.checkpoint.dir=", "model.attention=fused", "trainer.precision=bf16",
                     f"data.batch_size={batch}", "trainer.steps=1", "trainer.devices=1",
                     "trainer.threads_per_device=2", "trainer.eval_every=0",
                     "schedule.warmup_steps=1", f"trainer.recompute={recompute}"]
        cmd = [lockstep, "train", str(ROOT / "configs/gpt2_124m.yaml")]
        for o in overrides:
            cmd += ["--set", o]
        dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, check=True)
        host = to_bytes(re.search(r"; host ([\d.]+ [KMGT]?i?B)", dry.stdout)[1])
        acts = to_bytes(re.search(r"activations ([\d.]+ [KMGT]?i?B)", dry.stdout)[1])
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.execv(lockstep, cmd)
        _, status, usage = os.wait4(pid, 0)
        if status != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {status}")
        rss = usage.ru_maxrss * 1024
        first = first or (rss, acts)
        print(f"| {recompute} | {rss / 2**20:.0f} | {host / 2**20:.0f} | {acts / 2**20:.0f} | "
              f"{(first[0] - rss) / 2**20:.0f} | {(first[1] - acts) / 2**20:.0f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lockstep", default=str(ROOT / "build/lockstep"))
    ap.add_argument("--budget-gib", type=float, default=24.0)
    ap.add_argument("--skip-measure", action="store_true")
    ap.add_argument("--measure-batch", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        data = token_file(d, 64 * 1024 + 1, 50257)
        table(args.lockstep, data)
        budget = args.budget_gib * 2**30
        print(f"\n## Largest GPT-2-family model whose plan fits {args.budget_gib:g} GiB per worker "
              "at N 4 (B 8 x T 1024, bf16, AdamW)\n")
        for name, settings in (("zero 0, recompute none", ["trainer.zero=0", "trainer.recompute=none"]),
                               ("zero 2, recompute full", ["trainer.zero=2", "trainer.recompute=full"])):
            b = largest(args.lockstep, data, budget, settings)
            print(f"- {name}: n_layer = n_head = {b[0]}, d_model {b[1]}: {b[2] / 1e6:.0f}M "
                  f"parameters, {gib(b[3])} GiB per worker")
        if not args.skip_measure:
            measured(args.lockstep, data, args.measure_batch)


if __name__ == "__main__":
    main()
