#!/usr/bin/env python3
"""The PyTorch reference for bench_gpu's single-GPU figure (see bench/GPU.md).

The same MLP as bench_gpu (1024-4096-4096-1024, ReLU, PyTorch's default init), the same batch
(256), fp32 with TF32 off and on, softmax cross-entropy (mean over the batch), backward, and
torch.optim.SGD(lr=0.01, momentum=0.9) with PyTorch's defaults (foreach on CUDA, gradients set
to None by zero_grad). Eager mode, no torch.compile, no AMP. The batches are synthetic and
already on the GPU: a pool of 8 distinct random batches, used in turn.

Each run times --steps steps after --warmup steps with CUDA events (no host sync inside the
timed steps) and reports samples/s; the figure is the median over --runs runs.

    python3 bench/gpu_mlp_torch.py [--runs 5] [--warmup 10] [--steps 20] [--batch 256]
                                   [--sizes 1024,4096,4096,1024] [--csv FILE]

--breakdown (issue 25 item 8) times the step's ops one by one instead, as build/bench/
bench_mlp_ops does lockstep's, with the same names, one JSON line each: the ops autograd runs
for nn.Linear (addmm forward; mm for dweight and dx, a sum for dbias), ReLU and its
threshold_backward, cross-entropy with its gradient, and SGD's step; --repeat calls timed with
CUDA events, the median of --runs (--device cpu: wall time, to check the script anywhere).

Without torch or a usable GPU it prints "no usable GPU: <reason>" and exits 0.
"""
import argparse
import statistics
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--sizes", default="1024,4096,4096,1024",
                   help="inputs, hidden widths..., classes")
    p.add_argument("--csv", help="write the results here")
    p.add_argument("--breakdown", action="store_true", help="time the step's ops one by one")
    p.add_argument("--repeat", type=int, default=20, help="--breakdown: calls per timing")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="--breakdown only")
    p.add_argument("--tf32", action="store_true", help="--breakdown: TF32 on")
    a = p.parse_args()
    a.sizes = [int(s) for s in a.sizes.split(",")]
    if len(a.sizes) < 2 or min(a.runs, a.warmup, a.steps, a.batch) < 1:
        p.error("--sizes needs IN,...,CLASSES; --runs, --warmup, --steps, --batch must be >= 1")
    return a


def set_tf32(torch, enabled):
    """TF32 for fp32 matmuls (cuBLAS), through the API this torch prefers. Returns its name."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing it with allow_tf32 is an error
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        return "torch.backends.cuda.matmul.fp32_precision"
    matmul.allow_tf32 = enabled
    return "torch.backends.cuda.matmul.allow_tf32"


def build(torch, sizes, device):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def one_run(torch, a, batches, tf32):
    torch.manual_seed(0)
    model = build(torch, a.sizes, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for i in range(a.warmup):
        step(i)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000.0
    final_loss = float(loss)
    if final_loss != final_loss:
        raise RuntimeError(f"non-finite loss with tf32={tf32}")
    return a.steps / seconds, final_loss


def breakdown(torch, a):
    """--breakdown: each op of the step alone, named as bench_mlp_ops names lockstep's."""
    import json
    import time
    F = torch.nn.functional
    dev = a.device
    if dev == "cuda":
        set_tf32(torch, a.tf32)
    torch.manual_seed(0)
    model = build(torch, a.sizes, dev)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    B = a.batch
    x = [torch.randn(B, a.sizes[0], device=dev)]
    pre = []
    y = torch.randint(0, a.sizes[-1], (B,), device=dev)
    with torch.no_grad():
        for i, lin in enumerate(linears):
            pre.append(F.linear(x[-1], lin.weight, lin.bias))
            x.append(torch.relu(pre[-1]) if i + 1 < len(linears) else pre[-1])
    logits = x[-1].detach().requires_grad_(True)

    def timed(f):
        f()
        if dev == "cuda":
            torch.cuda.synchronize()
        v = []
        for _ in range(a.runs):
            if dev == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(a.repeat):
                    f()
                end.record()
                end.synchronize()
                v.append(start.elapsed_time(end) / 1e3 / a.repeat)
            else:
                t0 = time.perf_counter()
                for _ in range(a.repeat):
                    f()
                v.append((time.perf_counter() - t0) / a.repeat)
        return statistics.median(v)

    rows = []

    def add(op, flops, f):
        rows.append((op, timed(f), flops))

    n = len(linears)
    with torch.no_grad():
        for i, lin in enumerate(linears):
            fin, fout = a.sizes[i], a.sizes[i + 1]
            add(f"layer {i} forward linear {B}x{fin}->{fout}", 2.0 * B * fin * fout,
                lambda i=i, lin=lin: F.linear(x[i], lin.weight, lin.bias))
            if i + 1 < n:
                add(f"layer {i} forward relu", 0.0, lambda i=i: torch.relu(pre[i]))
    add(f"loss softmax cross-entropy {B}x{a.sizes[-1]}", 0.0,
        lambda: torch.autograd.grad(F.cross_entropy(logits, y), logits))
    rows.append(("zero grads", 0.0, 0.0))  # zero_grad sets them to None: no kernel
    dy = torch.randn(B, a.sizes[-1], device=dev) / B
    with torch.no_grad():
        for i in reversed(range(n)):
            lin, fin, fout = linears[i], a.sizes[i], a.sizes[i + 1]
            g = dy if i + 1 == n else torch.randn(B, fout, device=dev) / B
            if i + 1 < n:
                add(f"layer {i} backward relu", 0.0,
                    lambda g=g, i=i: torch.ops.aten.threshold_backward(g, pre[i], 0))

            def linear_backward(g=g, i=i, lin=lin, dx=i > 0):
                g.t().mm(x[i])  # dweight
                g.sum(0)        # dbias
                if dx:
                    g.mm(lin.weight)
            add(f"layer {i} backward linear {B}x{fin}<-{fout}"
                + (" (dweight, dbias, dx)" if i > 0 else " (dweight, dbias)"),
                (4.0 if i > 0 else 2.0) * B * fin * fout, linear_backward)
    rows.append(("grad norm (sum_squares_grains, step_control)", 0.0, 0.0))  # none: no clipping
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    add("sgd momentum 0.9", 0.0, opt.step)
    total = 0.0
    for op, seconds, flops in rows:
        total += seconds
        print(json.dumps({"framework": "torch", "op": op, "ms": round(1e3 * seconds, 5),
                          "tflops": round(flops / seconds / 1e12, 2) if flops else None}))
    print(json.dumps({"framework": "torch", "op": "sum", "ms": round(1e3 * total, 5),
                      "tflops": None}))
    return 0


def main():
    a = parse_args()
    if a.breakdown:
        try:
            import torch
        except ImportError as e:
            print(f"no usable GPU: torch is not importable ({e})")
            return 0
        if a.device == "cuda" and not torch.cuda.is_available():
            print(f"no usable GPU: torch {torch.__version__} sees no CUDA device")
            return 0
        return breakdown(torch, a)
    try:
        import torch
    except ImportError as e:
        print(f"no usable GPU: torch is not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"no usable GPU: torch {torch.__version__} sees no CUDA device")
        return 0

    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    inputs, classes = a.sizes[0], a.sizes[-1]
    batches = [(torch.randn(a.batch, inputs, device="cuda", generator=gen),
                torch.randint(0, classes, (a.batch,), device="cuda", generator=gen))
               for _ in range(8)]

    name = torch.cuda.get_device_name(0)
    print(f"gpu_mlp_torch: torch {torch.__version__} (CUDA {torch.version.cuda}), cuda:0 {name}")
    print(f"MLP {'-'.join(map(str, a.sizes))} (ReLU), batch {a.batch}, fp32, SGD momentum 0.9; "
          f"median of {a.runs} runs, {a.steps} steps timed after {a.warmup} warm-up")
    rows = []
    print(f"{'tf32':>6} {'steps/s':>10} {'samples/s':>12} {'runs min..max':>17} {'final loss':>11}")
    for tf32 in (False, True):
        api = set_tf32(torch, tf32)
        runs = [one_run(torch, a, batches, tf32) for _ in range(a.runs)]
        rates = [r[0] for r in runs]
        sps = statistics.median(rates)
        tag = "on" if tf32 else "off"
        print(f"{tag:>6} {sps:>10.1f} {sps * a.batch:>12.0f} "
              f"{min(rates):>8.1f}..{max(rates):<8.1f} {runs[-1][1]:>11.4f}")
        rows.append((tag, sps, sps * a.batch, min(rates), max(rates), runs[-1][1]))
    print(f"(TF32 switched with {api})")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("impl,tf32,batch,steps_per_s,samples_per_s,min_steps_per_s,max_steps_per_s,"
                    "final_loss\n")
            for tag, sps, samples, lo, hi, loss in rows:
                f.write(f"torch,{tag},{a.batch},{sps:.3f},{samples:.1f},{lo:.3f},{hi:.3f},"
                        f"{loss:.6g}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
