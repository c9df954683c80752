#!/usr/bin/env python
"""Training throughput of the GPT on our kernels (`ext`) against plain PyTorch ops (`torch`).

One process trains the same model shape (a preset's; default `baby`: 4 layers, 128 wide,
batch 12, context 64) with each set of kernels and reports tokens/s and the ratio ext/torch
(> 1: ours is faster), for each requested intra-op thread count.

What is timed is one optimizer step exactly as pygpt.train runs it: forward with the loss,
backward, gradient clipping, the optimizer step (AdamW or SGD with the preset's settings, via
pygpt.training.make_optimizer) and zero_grad; the batches (random windows of the shipped
Shakespeare text) are drawn beforehand. Both models start from the same weights.

Timing: `--warmup` untimed steps per kernel set, then `--steps` timed steps each, in alternating
blocks of `--block` steps (ext, torch, ext, ...), so a load change on a busy machine hits both
alike. tokens/s = batch * context / median step time.

Usage:
  python benchmarks/bench_train.py                     # baby shape, 1 and 2 threads
  python benchmarks/bench_train.py --threads 1 --steps 100
  python benchmarks/bench_train.py --preset shakespeare --batch-size 8 --steps 10
  python benchmarks/bench_train.py --markdown
  python benchmarks/bench_train.py --dtype bfloat16   # both sets under bfloat16 autocast
"""

import json

import torch

from machine import busy_warning
from timed_trainer import (Trainer, compare, describe_run, interleaved_steps, parse, parser,
                           shakespeare_steps, warn_if_losses_differ)
from pygpt.config import KERNEL_SETS

KERNELS = KERNEL_SETS  # ours, then the baseline


def bench(model_cfg, train_cfg, threads, steps, warmup, block, seed=0):
    torch.set_num_threads(threads)
    model_cfg, step_batches, init_state = shakespeare_steps(model_cfg, train_cfg, warmup + steps,
                                                            seed)
    trainers = {k: Trainer(model_cfg, train_cfg, k, init_state) for k in KERNELS}
    # Both see the same batches in the same order; steps alternate between the two in blocks.
    for i in range(warmup):
        for k in KERNELS:
            trainers[k].step(step_batches[i])
    times, losses = interleaved_steps(trainers, step_batches, warmup, steps, block)

    tokens_per_step = train_cfg.batch_size * train_cfg.grad_accum * model_cfg.block_size
    return {"threads": threads, "tokens_per_step": tokens_per_step,
            "params": trainers["ext"].model.num_params(),
            **compare(times, losses, tokens_per_step, *KERNELS)}


def main(argv=None):
    p = parser(__doc__, "kernel set", threads=[1, 2], steps=50, warmup=5,
               warmup_help="untimed steps per kernel set first")
    args, model_cfg, train_cfg = parse(p, argv)

    describe_run(args.preset, model_cfg, train_cfg,
                 f"{args.steps} timed steps each after {args.warmup} warmup, blocks of {args.block}")
    busy_warning(args.threads)
    results = [bench(model_cfg, train_cfg, t, args.steps, args.warmup, args.block)
               for t in args.threads]
    if args.json:
        for r in results:
            print(json.dumps(r))
    if args.markdown:
        print("| threads | ext tokens/s | torch tokens/s | ext/torch | ext step (ms) | "
              "torch step (ms) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['threads']} | {r['ext']['tokens_per_s']:,.0f} | "
                  f"{r['torch']['tokens_per_s']:,.0f} | {r['ratio']:.2f}x | "
                  f"{r['ext']['median_ms']:.1f} | {r['torch']['median_ms']:.1f} |")
    elif not args.json:
        print(f"{'threads':>7}  {'kernels':>7}  {'tokens/s':>10}  {'median ms':>9}  "
              f"{'IQR ms':>13}  {'ext/torch':>9}")
        for r in results:
            for k in KERNELS:
                s = r[k]
                ratio = f"{r['ratio']:.2f}x" if k == "ext" else ""
                print(f"{r['threads']:>7}  {k:>7}  {s['tokens_per_s']:>10,.0f}  "
                      f"{s['median_ms']:>9.1f}  {s['q1_ms']:>6.1f}-{s['q3_ms']:<6.1f}  "
                      f"{ratio:>9}")
    # Under autocast the two sets round differently (our ops compute in float32).
    warn_if_losses_differ(results, "ext", "torch", tol=1e-3 if args.dtype == "float32" else 3e-2)


if __name__ == "__main__":
    main()
