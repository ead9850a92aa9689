#!/usr/bin/python3
"""lockstep against PyTorch DistributedDataParallel (gloo, CPU): training throughput, one command.

Both frameworks train the same MLP on the same data (one CSV file, written here), with the same
per-worker batch, optimiser (SGD, momentum 0.9, same lr), step count and threads per worker:

  lockstep  build/lockstep train CONFIG --scaling N --summary-json FILE: one process, N worker
            threads, trainer.threads_per_device = T;
  torch     torch.multiprocessing.spawn of N processes, DDP over gloo, torch.set_num_threads(T)
            (and OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = T), batches gathered from the in-memory
            tensors (no DataLoader), shuffled every epoch.

T = max(1, cores // N), lockstep's own default, set explicitly in both.

PyTorch gets its best GEMM kernels: both frameworks call the system's OpenBLAS, which picks its
kernels by CPU model and can misread a CPU it does not know (Debian's 0.3.21 calls a Sapphire
Rapids VM "Prescott", without AVX at all). With OPENBLAS_VERBOSE=2 OpenBLAS names the core it
chose. Its own choice and every core /proc/cpuinfo's flags allow (AVX-512: SkylakeX, Cooperlake;
AVX2: Haswell, Zen) are timed on a PyTorch sgemm, and the fastest is set as OPENBLAS_CORETYPE
for the PyTorch runs (--openblas-coretype forces one; "detected" keeps OpenBLAS's choice).
lockstep gets no such help: it runs with the kernels OpenBLAS picks by itself (an
OPENBLAS_CORETYPE of the caller's environment is dropped for both). The kernels each framework
used are printed and written to the CSV. Throughput is measured
the same way in both: global samples/s from the end of step steps/10 to the end of the last step,
on rank 0 (start-up, data loading and the first tenth of the steps are excluded). Runs alternate
lockstep, torch, lockstep, torch, ...; the tables give medians. The final training loss is the
mean over the last tenth of the steps, over all workers, in both (lockstep's log window).

    /usr/bin/python3 bench/compare_ddp.py [--pairs 3] [--workers 1,2] [--out build/bench/ddp]
        [--lockstep build/lockstep] [--workloads small,large] [--threads T] [--quick]
        [--openblas-coretype auto|detected|CORE]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import svg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Workload:
    name: str
    features: int
    hidden: list
    classes: int
    batch: int      # per worker
    samples: int    # in the CSV
    steps: int
    lr: float

    def describe(self) -> str:
        sizes = "-".join(str(s) for s in [self.features, *self.hidden, self.classes])
        return f"{self.name} MLP {sizes}, batch {self.batch}/worker"


WORKLOADS = {
    "small": Workload("small", 64, [128], 10, 32, 8192, 3000, 0.05),
    "large": Workload("large", 1024, [2048, 2048], 10, 128, 4096, 60, 0.01),
}


# ---- Data: one CSV, read by both ------------------------------------------------------------

def dataset(w: Workload, out: str):
    """Writes (once) and reads the workload's CSV: Gaussian clusters, standardised features."""
    path = os.path.join(out, f"{w.name}_{w.samples}x{w.features}_{w.classes}.csv")
    cache = path + ".npz"  # the same values as the CSV, parsed once
    if not os.path.exists(path):
        rng = np.random.RandomState(0)
        centers = rng.randn(w.classes, w.features) * (3.0 / np.sqrt(w.features))
        y = rng.randint(0, w.classes, size=w.samples)
        x = centers[y] + rng.randn(w.samples, w.features)
        x = (x - x.mean(0)) / x.std(0)
        with open(path, "w") as f:
            for row, label in zip(x, y):
                f.write(",".join(f"{v:.5g}" for v in row) + f",{label}\n")
    if not os.path.exists(cache) or os.path.getmtime(cache) < os.path.getmtime(path):
        data = np.loadtxt(path, delimiter=",", dtype=np.float64)
        np.savez(cache, x=data[:, :-1].astype(np.float32), y=data[:, -1].astype(np.int64))
    return path, cache


# ---- lockstep -------------------------------------------------------------------------------

def run_lockstep(binary: str, w: Workload, csv_path: str, workers: int, threads: int, out: str):
    window = max(1, w.steps // 10)
    config = os.path.join(out, f"lockstep_{w.name}.yaml")
    with open(config, "w") as f:
        f.write(f"""# Written by bench/compare_ddp.py
model: {{type: mlp, hidden: [{", ".join(map(str, w.hidden))}], activation: relu}}
data: {{dataset: csv, path: {os.path.basename(csv_path)}, label_column: -1, eval_fraction: 0,
        normalize: false, batch_size: {w.batch}, shuffle: true}}
optimizer: {{type: sgd, lr: {w.lr}, momentum: 0.9}}
trainer: {{backend: cpu, devices: {workers}, steps: {w.steps}, seed: 0, log_every: {window},
           eval_every: 0, check_replicas_every: 0, threads_per_device: {threads}}}
""")
    summary = os.path.join(out, "lockstep_summary.json")
    proc = subprocess.run([binary, "train", config, "--scaling", str(workers), "--summary-json",
                           summary], capture_output=True, text=True, env=lockstep_environment())
    if proc.returncode != 0:
        sys.exit(f"compare_ddp: lockstep failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    with open(summary) as f:
        point = json.load(f)["scaling"][0]
    return point["samples_per_s"], point["summary"]["final_train_loss"]


def lockstep_environment() -> dict:
    """lockstep runs with the kernels OpenBLAS picks by itself: no OPENBLAS_CORETYPE."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    return env


# ---- OpenBLAS kernels -----------------------------------------------------------------------

# Cores OpenBLAS (DYNAMIC_ARCH) can run, by the instruction sets their kernels need.
AVX512_CORES = ["SkylakeX", "Cooperlake"]
AVX2_CORES = ["Haswell", "Zen"]
OLD_CORES = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
             "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona", "Bobcat"}
TORCH_GEMM = """
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
for _ in range(2): a @ b
t = []
for _ in range(9):
    t0 = time.perf_counter(); a @ b; t.append(time.perf_counter() - t0)
print("GFLOPS", 2 * 1024 ** 3 / sorted(t)[4] / 1e9)
"""


def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def openblas_core(command: list, env: dict) -> tuple:
    """(the core OpenBLAS chose for `command`, its output): OPENBLAS_VERBOSE=2 prints 'Core: X'."""
    env = dict(env, OPENBLAS_VERBOSE="2", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    text = proc.stdout + proc.stderr
    cores = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Core:")]
    return (cores[-1] if cores else "unknown"), text


def torch_core_candidates(flags: set) -> list:
    """The cores whose kernels this CPU can run (the AVX-512 ones are not always the fastest)."""
    out = []
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        out += AVX512_CORES if "avx512_bf16" in flags else AVX512_CORES[:1]
    if {"avx2", "fma"} <= flags:
        out += AVX2_CORES
    return out


def choose_torch_coretype(request: str, lockstep: str) -> tuple:
    """Returns (OPENBLAS_CORETYPE for PyTorch or None, lines saying what each framework uses)."""
    base = lockstep_environment()
    detected, _ = openblas_core([sys.executable, "-c", TORCH_GEMM], base)
    lockstep_core, _ = openblas_core([lockstep, "--version"], base)
    flags = cpu_flags()
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else
           "AVX" if "avx" in flags else "no AVX")
    lines = [f"CPU: {isa}; OpenBLAS picks '{detected}' for PyTorch, '{lockstep_core}' for lockstep"]
    if os.environ.get("OPENBLAS_CORETYPE"):
        lines.append(f"(OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} of this environment "
                     "is dropped for both)")
    if detected in OLD_CORES and isa != "no AVX":
        lines.append(f"OpenBLAS misdetects this CPU: '{detected}' kernels use no AVX, the CPU has {isa}")
    if request == "detected":
        return None, lines + [f"PyTorch: OpenBLAS's own choice, '{detected}' (--openblas-coretype)"]
    if request != "auto":
        core, _ = openblas_core([sys.executable, "-c", TORCH_GEMM], dict(base, OPENBLAS_CORETYPE=request))
        return request, lines + [f"PyTorch: OPENBLAS_CORETYPE={request} (--openblas-coretype), "
                                 f"OpenBLAS reports '{core}'"]
    timed = {}
    for core in [detected] + [c for c in torch_core_candidates(flags) if c != detected]:
        env = dict(base) if core == detected else dict(base, OPENBLAS_CORETYPE=core)
        best = 0.0
        for _ in range(3):
            _, text = openblas_core([sys.executable, "-c", TORCH_GEMM], env)
            got = [float(l.split()[1]) for l in text.splitlines() if l.startswith("GFLOPS")]
            best = max([best] + got)
        timed[core] = best
    fastest = max(timed, key=timed.get)
    lines.append("PyTorch 1024^3 sgemm, 1 thread, best of 3 medians: " +
                 ", ".join(f"{c} {g:.1f} GFLOP/s" for c, g in timed.items()))
    if fastest == detected:
        return None, lines + [f"PyTorch: OpenBLAS's own choice, '{detected}', is the fastest"]
    return fastest, lines + [f"PyTorch: OPENBLAS_CORETYPE={fastest} (faster than '{detected}')"]


# ---- torch DDP ------------------------------------------------------------------------------

def torch_worker(rank: int, world: int, w: Workload, cache: str, threads: int, port: int, queue):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = np.load(cache)
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    sizes = [w.features, *w.hidden, w.classes]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    model = DDP(nn.Sequential(*layers))  # bucket_cap_mb 25, as lockstep's default
    opt = torch.optim.SGD(model.parameters(), lr=w.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    warmup, window = max(1, w.steps // 10), max(1, w.steps // 10)
    per_rank = w.samples // world
    batches_per_epoch = max(1, per_rank // w.batch)
    loss_sum, t_warm, t_end, epoch, shard = 0.0, 0.0, 0.0, -1, None
    dist.barrier()
    start = time.perf_counter()
    for step in range(w.steps):
        b = step % batches_per_epoch
        if b == 0:  # a new epoch: shuffle with the epoch's seed, as DistributedSampler does
            epoch += 1
            g = torch.Generator().manual_seed(epoch)
            shard = torch.randperm(w.samples, generator=g)[rank:per_rank * world:world]
        idx = shard[b * w.batch:(b + 1) * w.batch]
        out = model(x[idx])
        loss = loss_fn(out, y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= w.steps - window:
            loss_sum += loss.item()
        if step + 1 == warmup:
            t_warm = time.perf_counter()
    t_end = time.perf_counter()
    total = torch.tensor([loss_sum])
    dist.all_reduce(total)
    if rank == 0:
        samples = (w.steps - warmup) * w.batch * world
        queue.put((samples / (t_end - t_warm), total.item() / (window * world), t_end - start))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(w: Workload, cache: str, workers: int, threads: int, coretype):
    import torch.multiprocessing as mp
    if coretype:  # read by OpenBLAS as each spawned child loads it
        os.environ["OPENBLAS_CORETYPE"] = coretype
    else:  # OpenBLAS's own choice, as for lockstep
        os.environ.pop("OPENBLAS_CORETYPE", None)
    # torch's GEMMs go to OpenBLAS (Debian's build), whose own thread pool ignores
    # torch.set_num_threads: cap it, and OpenMP's, at T too. Spawned children read these.
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: no network needed
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(torch_worker, args=(workers, w, cache, threads, free_port(), queue), nprocs=workers,
             join=True)
    sps, loss, _ = queue.get()
    return sps, loss


# ---- Driver ---------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lockstep", default=os.path.join(ROOT, "build", "lockstep"))
    ap.add_argument("--pairs", type=int, default=3, help="lockstep/torch run pairs per point")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--workloads", default="small,large")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "ddp"))
    ap.add_argument("--threads", type=int, default=0,
                    help="threads per worker in both frameworks; 0: max(1, cores / N)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the steps (a smoke test)")
    ap.add_argument("--openblas-coretype", default="auto",
                    help="PyTorch's OpenBLAS kernels: auto (the fastest the CPU allows, timed), "
                         "detected (OpenBLAS's own choice) or a core name (SkylakeX, Haswell, ...)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not os.access(args.lockstep, os.X_OK):
        sys.exit(f"compare_ddp: {args.lockstep} is not built (cmake --build build)")
    cores = os.cpu_count() or 1
    import torch
    print(f"torch {torch.__version__}, {cores} cores, lockstep {args.lockstep}")
    coretype, kernel_lines = choose_torch_coretype(args.openblas_coretype, args.lockstep)
    for line in kernel_lines:
        print(line)
    torch_kernels = coretype or "detected"

    runs, rows = [], []
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        if args.quick:
            w.steps = max(20, w.steps // 10)
        csv_path, cache = dataset(w, args.out)
        for n in [int(v) for v in args.workers.split(",")]:
            threads = args.threads or max(1, cores // n)
            got = {"lockstep": [], "torch": []}
            losses = {"lockstep": [], "torch": []}
            for p in range(args.pairs):  # alternate, so drift in machine load hits both alike
                for fw in ("lockstep", "torch"):
                    if fw == "lockstep":
                        sps, loss = run_lockstep(args.lockstep, w, csv_path, n, threads, args.out)
                    else:
                        sps, loss = run_torch(w, cache, n, threads, coretype)
                    got[fw].append(sps)
                    losses[fw].append(loss)
                    runs.append([name, n, threads, fw, p, f"{sps:.1f}", f"{loss:.5f}"])
                    print(f"  {w.describe()}, N={n}, {threads} thread(s)/worker, {fw:8} run {p}: "
                          f"{sps:10.0f} samples/s, final loss {loss:.4f}", flush=True)
            ls, ts = statistics.median(got["lockstep"]), statistics.median(got["torch"])
            rows.append({"workload": name, "describe": w.describe(), "workers": n,
                         "threads_per_worker": threads, "steps": w.steps,
                         "lockstep_samples_per_s": ls, "torch_samples_per_s": ts,
                         "ratio": ls / ts,
                         "lockstep_final_loss": statistics.median(losses["lockstep"]),
                         "torch_final_loss": statistics.median(losses["torch"]),
                         "torch_openblas_coretype": torch_kernels})

    print(f"\nmedians over {args.pairs} alternating pairs; samples/s = global, steady state")
    print("\n".join(kernel_lines) + "\n")
    head = (f"{'workload':<44} {'N':>2} {'thr':>3} {'steps':>5} {'lockstep/s':>11} {'torch/s':>10} "
            f"{'ratio':>6} {'loss ls':>8} {'loss torch':>10}")
    print(head)
    for r in rows:
        print(f"{r['describe']:<44} {r['workers']:>2} {r['threads_per_worker']:>3} {r['steps']:>5} "
              f"{r['lockstep_samples_per_s']:>11.0f} {r['torch_samples_per_s']:>10.0f} "
              f"{r['ratio']:>6.2f} {r['lockstep_final_loss']:>8.4f} {r['torch_final_loss']:>10.4f}")

    with open(os.path.join(args.out, "compare_ddp_runs.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["workload", "workers", "threads_per_worker", "framework", "run",
                     "samples_per_s", "final_train_loss"])
        wr.writerows(runs)
    svg.save_rows(os.path.join(args.out, "compare_ddp.csv"), rows)

    charts = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        sel = [r for r in rows if r["workload"] == name]
        charts.append(svg.bar_chart(
            sel[0]["describe"], groups=[f"N={r['workers']} ({r['threads_per_worker']} thr/worker)"
                                        for r in sel],
            series={"lockstep": [r["lockstep_samples_per_s"] for r in sel],
                    "PyTorch DDP (gloo)": [r["torch_samples_per_s"] for r in sel]},
            y_label="samples/s (global, median)",
            notes=[f"{r['ratio']:.2f}x" for r in sel]))
    path = os.path.join(args.out, "compare_ddp.svg")
    svg.save(path, charts, columns=2,
             title=f"lockstep vs PyTorch DDP, CPU, median of {args.pairs} alternating runs")
    print(f"\nwrote {args.out}/compare_ddp.csv, compare_ddp_runs.csv, compare_ddp.svg")


if __name__ == "__main__":
    main()
