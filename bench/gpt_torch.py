#!/usr/bin/env python3
"""One GPT training step in PyTorch eager, the peer of build/bench/bench_gpt.

    python3 bench/gpt_torch.py [--preset tiny|small|124m] [--batch B] [--steps N] [--warmup W]
                               [--device cpu|cuda] [--tf32] [--bf16 | --best] [--threads T]

The model is tests/model/gpt_parity.py's (nanoGPT's layout, the architecture lockstep trains),
the step forward + cross-entropy + backward + AdamW on a fixed batch of random tokens, timed
around each step (with torch.cuda.synchronize on a GPU) after --warmup steps. --bf16 runs the
forward and the loss under torch.autocast(dtype=torch.bfloat16), PyTorch's mixed precision
(fp32 weights and optimiser, bf16 matrix products). Prints one JSON line with the median step
time and tokens/s, the same fields as bench_gpt, and the precision.

--best is PyTorch at its best, what a PyTorch user trains with on a GPU (issue 25): autocast to
bfloat16, F.scaled_dot_product_attention (FlashAttention where it applies), the fused AdamW
(on CUDA) and torch.compile. It needs PyTorch 2. The compilation happens in the first warmup
step; its time, less one median step, is reported as compile_s and excluded from the median.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "model"))
from gpt_parity import GPT  # noqa: E402

PRESETS = {
    "tiny": dict(vocab=256, context=64, n_layer=4, n_head=4, d_model=128),
    "small": dict(vocab=512, context=128, n_layer=4, n_head=4, d_model=256),
    "124m": dict(vocab=50257, context=1024, n_layer=12, n_head=12, d_model=768),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny", choices=PRESETS)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16")
    ap.add_argument("--best", action="store_true",
                    help="bf16 autocast, scaled_dot_product_attention, fused AdamW, torch.compile")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.best:
        if not hasattr(F, "scaled_dot_product_attention") or not hasattr(torch, "compile"):
            ap.error(f"--best needs PyTorch 2 (scaled_dot_product_attention, torch.compile); "
                     f"this is {torch.__version__}")
        args.bf16 = True
        args.warmup = max(args.warmup, 2)  # the first compiles, the second settles
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    p = PRESETS[args.preset]
    torch.manual_seed(0)
    model = GPT(p["vocab"], p["context"], p["n_layer"], p["n_head"], p["d_model"],
                sdpa=args.best).to(args.device)
    with torch.no_grad():  # GPT-2's initialisation, as lockstep's (the loss starts near log V)
        for name, q in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or "ln_f.weight" in name:
                q.fill_(1.0)
            elif q.dim() == 1:
                q.zero_()
            else:
                std = 0.02 / (2 * p["n_layer"]) ** 0.5 if name.endswith("c_proj.weight") else 0.02
                q.normal_(0.0, std)
    fused = {"fused": True} if args.best and args.device.startswith("cuda") else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, **fused)
    forward = torch.compile(model) if args.best else model
    w = torch.randint(0, p["vocab"], (args.batch, p["context"] + 1), device=args.device)
    x, y = w[:, :-1], w[:, 1:].reshape(-1)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    times, warmup_s = [], []
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        with (torch.autocast(kind, dtype=torch.bfloat16) if args.bf16
              else contextlib.nullcontext()):
            logits = forward(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        (times if step >= args.warmup else warmup_s).append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    print(json.dumps({
        "framework": "torch " + torch.__version__, "device": args.device, "preset": args.preset,
        "precision": "best" if args.best else ("bf16" if args.bf16 else
                                               ("tf32" if args.tf32 else "fp32")),
        "params": sum(q.numel() for q in model.parameters()), "batch": args.batch,
        "context": p["context"], "steps": args.steps, "step_ms": round(1e3 * step_s, 4),
        "tokens_per_s": round(args.batch * p["context"] / step_s, 1), "last_loss": loss.item(),
        "compile_s": round(warmup_s[0] - step_s, 3) if args.best else 0.0}))


if __name__ == "__main__":
    main()
