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


def main():
    a = parse_args()
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
