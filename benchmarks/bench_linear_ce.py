#!/usr/bin/env python
"""Benchmark pygpt.ops.linear_cross_entropy (the LM head and loss fused, chunked) against the
unfused F.linear + F.cross_entropy, forward + backward, in time and in peak memory.

Inputs: x (N, C), weight (V, C), bias none, int64 targets (N,) with every 10th one ignored; the
loss's .backward() computes the gradients of x and weight (as a training step's head does).

Time: the median of --repeat calls of each, ours and ATen's alternated in one process (as
bench_kernels.py's time_pair does), after --warmup calls of each; .grad reset outside the
timed region. Wall time, and the process's CPU time per call (time.process_time), which other
processes on a shared machine disturb much less (one thread: CPU time ~ the work done).

Peak memory, two ways (both above what was live before the call: the inputs):
  * rss: a fresh subprocess per variant builds the inputs, warms the op up on a tiny input,
    resets the peak-RSS mark (/proc/self/clear_refs) and reports VmHWM - VmRSS(before) after one
    forward + backward. It counts everything the process touched, at page granularity, the
    gradients kept in .grad included.
  * alloc: the peak of the CPU allocator's running total from torch.profiler(profile_memory=True)
    in this process (tensor allocations only).

Usage:
  python benchmarks/bench_linear_ce.py                          # GPT-2 head: 4096 x 768 x 50257
  python benchmarks/bench_linear_ce.py --shape 1024 768 8192 --repeat 5
  python benchmarks/bench_linear_ce.py --chunk-rows 64           # another chunk size
  MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/bench_linear_ce.py
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from bench_kernels import _status_kib, alloc_peak_bytes, time_pair
from machine import busy_warning, cpu_model


def inputs(N, C, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g).requires_grad_()
    w = (torch.randn(V, C, generator=g) / C ** 0.5).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    t[::10] = -100
    return x, w, t


def variants(chunk_rows):
    """name -> fwd+bwd of one call on (x, w, t)."""
    from pygpt.ops import linear_cross_entropy

    def ours(x, w, t):
        linear_cross_entropy(x, w, t, chunk_rows=chunk_rows).backward()

    def aten(x, w, t):
        F.cross_entropy(F.linear(x, w), t).backward()

    return {"ours": ours, "aten": aten}


def rss_child(name, N, C, V, chunk_rows, threads):
    """In a fresh subprocess: peak RSS growth (bytes) of one fwd+bwd call of variant name."""
    torch.set_num_threads(threads)
    fn = variants(chunk_rows)[name]
    fn(*inputs(4, 8, 16))  # warm-up: thread pool, dispatcher, op registration
    x, w, t = inputs(N, C, V)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib()["VmRSS"]
    fn(x, w, t)
    print(json.dumps({"bytes": (_status_kib()["VmHWM"] - before) * 1024}))


def rss_peak_bytes(name, N, C, V, chunk_rows, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--_rss-child", name, str(N), str(C),
           str(V), str(chunk_rows or 0), str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["bytes"]


def in_process(N, C, V, args):
    """Median fwd+bwd wall seconds of ours and ATen's (alternated), the number of calls each,
    the median CPU seconds of each, and each one's profiler peak of allocated bytes."""
    fns = variants(args.chunk_rows)
    x, w, t = inputs(N, C, V)

    def reset():
        x.grad = w.grad = None

    cpu = {"ours": [], "aten": []}

    def timed(name):  # also notes the call's CPU time, which other processes' load hardly moves
        def call():
            t0 = time.process_time()
            fns[name](x, w, t)
            cpu[name].append(time.process_time() - t0)
        return call

    times = time_pair(timed("ours"), timed("aten"), reset, args.warmup, args.repeat, budget_s=0)
    cpu_medians = [statistics.median(cpu[k][args.warmup:]) for k in ("ours", "aten")]
    peaks = [alloc_peak_bytes(lambda f=fns[k]: f(x, w, t), reset) for k in ("ours", "aten")]
    return (*times, *cpu_medians, *peaks)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=int, nargs=3, metavar=("N", "C", "V"),
                   default=[4096, 768, 50257])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--chunk-rows", type=int, default=None,
                   help="rows per chunk (default: pygpt.ops.linear_cross_entropy.chunk_rows)")
    p.add_argument("--_rss-child", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._rss_child:
        name, *nums = args._rss_child
        N, C, V, rows, threads = map(int, nums)
        rss_child(name, N, C, V, rows or None, threads)
        return

    from pygpt.ops.linear_cross_entropy import chunk_rows

    torch.set_num_threads(args.threads)
    N, C, V = args.shape
    rows = args.chunk_rows or chunk_rows(N, V, torch.float32)
    print("# bench_linear_ce: " + " ".join([sys.executable, *sys.argv]))
    print(f"# CPU: {cpu_model()}; threads: {args.threads}; torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    isa = {k: os.environ[k] for k in ("MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
           if k in os.environ}
    if isa:
        print("# ISA forced: " + ", ".join(f"{k}={v}" for k, v in isa.items()))
    busy_warning([args.threads])
    print(f"# N={N} C={C} V={V} float32; ours: {rows} rows per chunk "
          f"({rows * V * 4 / 2**20:.1f} MiB of logits), {-(-N // rows)} chunks; logits (N, V) "
          f"would be {N * V * 4 / 2**20:.0f} MiB")
    t_ours, t_aten, n, c_ours, c_aten, a_ours, a_aten = in_process(N, C, V, args)
    r_ours, r_aten = (rss_peak_bytes(k, N, C, V, args.chunk_rows, args.threads)
                      for k in ("ours", "aten"))
    mib = 2**20
    print("| what | ours | F.linear + F.cross_entropy | ours / ATen |")
    print("|---|---|---|---|")
    print(f"| fwd+bwd time, median of {n} (s) | {t_ours:.3f} | {t_aten:.3f} | "
          f"{t_ours / t_aten:.2f}x |")
    print(f"| fwd+bwd CPU time, median of {n} (s) | {c_ours:.3f} | {c_aten:.3f} | "
          f"{c_ours / c_aten:.2f}x |")
    print(f"| peak RSS growth (MiB) | {r_ours / mib:.0f} | {r_aten / mib:.0f} | "
          f"{r_ours / r_aten:.2f}x |")
    print(f"| peak allocated, profiler (MiB) | {a_ours / mib:.0f} | {a_aten / mib:.0f} | "
          f"{a_ours / a_aten:.2f}x |")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
