#!/usr/bin/python3
"""Bandwidth of PyTorch's gloo all-reduce (torch.distributed, CPU, one process per rank).

The same sizes and definitions as bench_allreduce: float32 sum over 4 KB .. MAX MB (x4 steps),
algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests). A repetition's time is the slowest
rank's: every rank leaves a barrier, times one all_reduce, and the maximum over ranks counts;
the table gives the median over repetitions (two untimed warm-up calls first).

    /usr/bin/python3 bench/allreduce_gloo.py [--ranks 2,4] [--max-mb 256] [--reps 20] [--csv FILE]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time


def sizes(max_mb: int) -> list:
    out, b = [], 4096
    while b <= max_mb << 20:
        out.append(b)
        b *= 4
    return out


def reps_for(nbytes: int, reps: int) -> int:
    return max(3, reps // 4) if nbytes >= 64 << 20 else reps  # as bench_allreduce


def worker(rank: int, world: int, port: int, max_mb: int, reps: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for nbytes in sizes(max_mb):
        buf = torch.full((nbytes // 4,), float(rank + 1))
        times = []
        for r in range(reps_for(nbytes, reps) + 2):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            dt = time.perf_counter() - t0
            if r >= 2:
                times.append(dt)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        results.append((nbytes, statistics.median(slowest.tolist())))
        del buf
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(ranks: list, max_mb: int, reps: int) -> list:
    """Rows (ranks, bytes, seconds), for every rank count and size."""
    import torch.multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: no network needed
    ctx = mp.get_context("spawn")
    rows = []
    for n in ranks:
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(n, free_port(), max_mb, reps, queue), nprocs=n, join=True)
        rows += [(n, nbytes, t) for nbytes, t in queue.get()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--max-mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    rows = measure([int(v) for v in args.ranks.split(",")], args.max_mb, args.reps)
    lines = ["ranks,bytes,time_us,algbw_gbs,busbw_gbs"]
    print(f"{'ranks':>5} {'bytes':>12} {'time_us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10}")
    for n, nbytes, t in rows:
        algbw = nbytes / t / 1e9
        busbw = algbw * 2 * (n - 1) / n
        print(f"{n:>5} {nbytes:>12} {t * 1e6:>10.1f} {algbw:>10.2f} {busbw:>10.2f}", flush=True)
        lines.append(f"{n},{nbytes},{t * 1e6:.2f},{algbw:.3f},{busbw:.3f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
