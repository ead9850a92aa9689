#!/usr/bin/env python3
"""Checks lockstep's GPT against the same architecture written in PyTorch.

    build/lockstep_tests -tc='gpt parity with PyTorch*'      # runs this script itself
    python3 tests/model/gpt_parity.py DIR [--device cuda]

DIR holds what the C++ side wrote (tests/model/test_gpt_parity.cpp):
  manifest.json  the model shape, the optimiser, the steps, the tensors' names, offsets and
                 shapes in the flat parameter buffer, and lockstep's loss at every step
  init.f32       the initial parameters, flat float32 in lockstep's layout
  tokens.i32     steps x batch x (context + 1) token windows, int32
  grads1.f32     lockstep's gradient at step 1, flat float32
  final.f32      lockstep's parameters after the last step, flat float32

The PyTorch model is nanoGPT's layout: token and position embeddings, pre-LayerNorm blocks
(causal self-attention, 4x MLP with tanh-GELU), a final LayerNorm, an LM head tied to the
token embedding; nn.Linear weights are (out, in) as in lockstep. It starts from init.f32,
trains on the same windows with torch.optim.AdamW in two parameter groups (weight decay on the
tensors of 2 or more dimensions only, as nanoGPT), and compares the loss at every step, every
gradient at step 1 and every parameter after the last step: relative error <= --tol (1e-4)
in fp32. Works with torch 1.13 on
the CPU and torch 2.x on a GPU. Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c)
        self.attn.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, 4 * c)
        self.mlp.c_proj = nn.Linear(4 * c, c)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(x).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.attn.c_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, n_layer, n_head, d_model):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, d_model)
        self.transformer.wpe = nn.Embedding(context, d_model)
        self.transformer.h = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.transformer.ln_f = nn.LayerNorm(d_model)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x) @ self.transformer.wte.weight.t()  # tied LM head


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    with open(os.path.join(args.dir, "manifest.json")) as f:
        m = json.load(f)
    spec, opt = m["model"], m["optimizer"]
    flat = np.fromfile(os.path.join(args.dir, "init.f32"), dtype=np.float32)
    grads = np.fromfile(os.path.join(args.dir, "grads1.f32"), dtype=np.float32)
    windows = np.fromfile(os.path.join(args.dir, "tokens.i32"), dtype=np.int32)
    windows = windows.reshape(m["steps"], m["batch"], spec["context"] + 1)

    model = GPT(spec["vocab_size"], spec["context"], spec["n_layer"], spec["n_head"],
                spec["d_model"]).to(args.device)
    params = dict(model.named_parameters())
    tensors = m["tensors"]
    if sorted(t["name"] for t in tensors) != sorted(params):
        print("tensor names differ:", sorted(t["name"] for t in tensors), sorted(params))
        return 1
    with torch.no_grad():
        for t in tensors:
            n = int(np.prod(t["shape"]))
            src = flat[t["offset"]:t["offset"] + n].reshape(t["shape"])
            params[t["name"]].copy_(torch.from_numpy(src.copy()))

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                               {"params": no_decay, "weight_decay": 0.0}], lr=opt["lr"],
                              betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    worst = 0.0
    ok = True
    print(f"{'step':>4} {'lockstep loss':>14} {'torch loss':>14} {'rel err':>9}")
    for step in range(m["steps"]):
        w = torch.from_numpy(windows[step].astype(np.int64)).to(args.device)
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        adamw.zero_grad()
        loss.backward()
        ours = m["losses"][step]
        err = abs(ours - loss.item()) / abs(loss.item())
        worst = max(worst, err)
        ok &= err <= args.tol
        print(f"{step + 1:>4} {ours:>14.8f} {loss.item():>14.8f} {err:>9.2e}")
        if step == 0:
            print(f"{'step-1 gradient':<40} {'rel err':>9}")
            for t in tensors:
                n = int(np.prod(t["shape"]))
                ours_g = torch.from_numpy(grads[t["offset"]:t["offset"] + n].reshape(t["shape"]).copy())
                err = rel_err(ours_g, params[t["name"]].grad.detach().cpu())
                ok &= err <= args.tol
                print(f"{t['name']:<40} {err:>9.2e}")
        adamw.step()
    final = np.fromfile(os.path.join(args.dir, "final.f32"), dtype=np.float32)
    print(f"{'parameter after the last step':<40} {'rel err':>9}")
    for t in tensors:
        n = int(np.prod(t["shape"]))
        ours_p = torch.from_numpy(final[t["offset"]:t["offset"] + n].reshape(t["shape"]).copy())
        theirs_p = params[t["name"]].detach().cpu()
        if t["name"].endswith("attn.c_attn.bias"):
            # The key bias adds the same q.b to every score of a row, which softmax ignores: its
            # gradient is zero up to rounding, and Adam scales that rounding up to lr-sized steps.
            c = spec["d_model"]
            keep = torch.ones(3 * c, dtype=torch.bool)
            keep[c:2 * c] = False
            ours_p, theirs_p = ours_p[keep], theirs_p[keep]
        err = rel_err(ours_p, theirs_p)
        ok &= err <= args.tol
        print(f"{t['name']:<40} {err:>9.2e}")
    print(f"worst loss relative error {worst:.2e}; tolerance {args.tol:g}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
