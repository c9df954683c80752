#!/usr/bin/env python
"""Benchmark pygpt's fused ops (bias_gelu, add_layer_norm) against the unfused ops they replace,
forward + backward, at the transformer block shapes of a training step of the presets.

Rows per preset: batch * context (baby 12 * 64, shakespeare 64 * 256; --batch-size overrides
the batch), channels n_embd (add_layer_norm) and 4 * n_embd (the MLP's hidden width). Pairs
timed (ours / baseline, < 1 means ours is faster):

  bias_gelu      pygpt.ops.bias_gelu(h, b)                  vs F.gelu(h + b)
  fc+gelu        F.linear(x, W) then pygpt.ops.bias_gelu    vs F.gelu(F.linear(x, W, b)), the
                 whole first half of the MLP as pygpt.nn.MLP runs it on each kernel set
  add_ln         pygpt.ops.add_layer_norm(x, r, w, b)       vs x + r then F.layer_norm
  add_ln/ext     pygpt.ops.add_layer_norm(x, r, w, b)       vs x + r then pygpt.ops.layer_norm
                 (the unfused path of our kernel set)

Each call is the forward and a backward from precomputed output gradients (add_layer_norm: a
gradient into both outputs, the sum and the normalised rows, as in a pre-norm block); gradients
are reset to None outside the timed region. Timing: `--warmup` untimed calls, then the median
over `--repeat` calls of time.perf_counter() around each call, ours and the baseline
alternating, so that load drift hits both alike (--clock cpu: the thread's CPU time instead of
wall time, for a machine shared with other work). CPU only; intra-op threads from --threads.

Usage:
  python benchmarks/bench_fused.py                      # baby and shakespeare, 1 thread
  python benchmarks/bench_fused.py --preset baby --repeat 200
  python benchmarks/bench_fused.py --markdown
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import pygpt.ops as ops
from machine import busy_warning
from pygpt.config.presets import preset


def _leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def _bias_gelu_pair(N, C, hidden):
    h, b = _leaves(torch.randn(N, hidden), torch.randn(hidden))
    g = torch.randn(N, hidden)
    return (lambda: ops.bias_gelu(h, b).backward(g),
            lambda: F.gelu(h + b).backward(g), (h, b))


def _fc_gelu_pair(N, C, hidden):
    x, w, b = _leaves(torch.randn(N, C), torch.randn(hidden, C) * C ** -0.5, torch.randn(hidden))
    g = torch.randn(N, hidden)
    return (lambda: ops.bias_gelu(F.linear(x, w), b).backward(g),
            lambda: F.gelu(F.linear(x, w, b)).backward(g), (x, w, b))


def _add_ln_pair(layer_norm):
    def make(N, C, hidden):
        x, r, w, b = _leaves(torch.randn(N, C), torch.randn(N, C), 1 + 0.1 * torch.randn(C),
                             0.1 * torch.randn(C))
        gs, gy = torch.randn(N, C), torch.randn(N, C)

        def unfused():
            s = x + r
            torch.autograd.backward([s, layer_norm(s, w, b)], [gs, gy])

        return (lambda: torch.autograd.backward(list(ops.add_layer_norm(x, r, w, b)), [gs, gy]),
                unfused, (x, r, w, b))
    return make


PAIRS = {
    "bias_gelu": _bias_gelu_pair,
    "fc+gelu": _fc_gelu_pair,
    "add_ln": _add_ln_pair(lambda s, w, b: F.layer_norm(s, s.shape[-1:], w, b)),
    "add_ln/ext": _add_ln_pair(ops.layer_norm),
}


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def time_pair(ours, base, leaves, warmup, repeat, clock=time.perf_counter):
    """Median seconds of each, the calls alternating."""
    times = ([], [])
    for i in range(warmup + repeat):
        for fn, acc in zip((ours, base), times):
            for t in leaves:
                t.grad = None
            start = clock()
            fn()
            elapsed = clock() - start
            if i >= warmup:
                acc.append(elapsed)
    return statistics.median(times[0]), statistics.median(times[1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=["baby", "shakespeare"])
    p.add_argument("--batch-size", type=int, default=None, help="override the presets' batch")
    p.add_argument("--op", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=None,
                   help="timed calls per pair (default: 100 at baby size, fewer for larger)")
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="cpu: this thread's CPU time, steadier than wall time on a shared "
                        "machine (1 thread only)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu measures one thread: use it with --threads 1")
    torch.set_num_threads(args.threads)
    busy_warning([args.threads])
    torch.manual_seed(0)
    rows = []
    for name in args.preset:
        pr = preset(name)
        batch = args.batch_size or pr.train.batch_size
        N, C = batch * pr.model.block_size, pr.model.n_embd
        repeat = args.repeat or max(5, min(100, 20_000_000 // (N * C * 4)))
        for op in args.op:
            ours, base, leaves = PAIRS[op](N, C, 4 * C)
            t_ours, t_base = time_pair(ours, base, leaves, args.warmup, repeat,
                                       CLOCKS[args.clock])
            rows.append((name, f"{N}x{C}", op, t_ours * 1e3, t_base * 1e3, t_ours / t_base))
    if args.markdown:
        print("| preset | rows x n_embd | op | ours (ms) | baseline (ms) | ours/baseline |")
        print("|---|---|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.2f}x |")
        return
    print(f"{'preset':<12} {'shape':>10} {'op':<11} {'ours ms':>9} {'base ms':>9} "
          f"{'ours/base':>9}")
    for r in rows:
        print(f"{r[0]:<12} {r[1]:>10} {r[2]:<11} {r[3]:9.3f} {r[4]:9.3f} {r[5]:8.2f}x")


if __name__ == "__main__":
    main()
