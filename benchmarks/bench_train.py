#!/usr/bin/env python
"""Training throughput of the GPT on our kernels (`ext`) against plain PyTorch ops (`torch`), or
(`--versus float32`) of our kernels in a low number type against the same in float32.

One process trains the same model shape (a preset's; default `baby`: 4 layers, 128 wide,
batch 12, context 64) on each side and reports tokens/s and the ratio of ours to the other
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
  python benchmarks/bench_train.py --dtype bfloat16 --versus float32
                                        # ours in bfloat16 against ours in float32
"""

import dataclasses
import json

import torch

from machine import busy_warning
from timed_trainer import (Trainer, compare, describe_run, interleaved_steps, parse, parser,
                           shakespeare_steps, warn_if_losses_differ)
from pygpt.config import KERNEL_SETS


def sides(train_cfg, versus):
    """The two sides, ours first: {name: (kernel set, training config)}. versus "torch": plain
    PyTorch ops in the same number type; "float32": our kernels without autocast."""
    if versus == "torch":
        return {k: (k, train_cfg) for k in KERNEL_SETS}
    return {train_cfg.dtype: ("ext", train_cfg),
            "float32": ("ext", dataclasses.replace(train_cfg, dtype="float32"))}


def bench(model_cfg, train_cfg, threads, steps, warmup, block, versus="torch", seed=0):
    torch.set_num_threads(threads)
    model_cfg, step_batches, init_state = shakespeare_steps(model_cfg, train_cfg, warmup + steps,
                                                            seed)
    trainers = {name: Trainer(model_cfg, cfg, kernels, init_state)
                for name, (kernels, cfg) in sides(train_cfg, versus).items()}
    # Both see the same batches in the same order; steps alternate between the two in blocks.
    for i in range(warmup):
        for trainer in trainers.values():
            trainer.step(step_batches[i])
    times, losses = interleaved_steps(trainers, step_batches, warmup, steps, block)

    tokens_per_step = train_cfg.batch_size * train_cfg.grad_accum * model_cfg.block_size
    new, base = trainers
    return {"threads": threads, "tokens_per_step": tokens_per_step,
            "params": trainers[new].model.num_params(), "sides": [new, base],
            **compare(times, losses, tokens_per_step, new, base)}


def main(argv=None):
    p = parser(__doc__, "side", threads=[1, 2], steps=50, warmup=5,
               warmup_help="untimed steps per side first")
    p.add_argument("--versus", choices=["torch", "float32"], default="torch",
                   help="what our kernels in --dtype run against: plain PyTorch ops in --dtype, "
                        "or our kernels in float32")
    args, model_cfg, train_cfg = parse(p, argv)
    if args.versus == "float32" and args.dtype == "float32":
        p.error("--versus float32 compares a low --dtype (bfloat16, float16) with float32")

    describe_run(args.preset, model_cfg, train_cfg,
                 f"{args.steps} timed steps each after {args.warmup} warmup, blocks of {args.block}")
    busy_warning(args.threads)
    results = [bench(model_cfg, train_cfg, t, args.steps, args.warmup, args.block, args.versus)
               for t in args.threads]
    new, base = results[0]["sides"]
    if args.json:
        for r in results:
            print(json.dumps(r))
    if args.markdown:
        print(f"| threads | {new} tokens/s | {base} tokens/s | {new}/{base} | {new} step (ms) | "
              f"{base} step (ms) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['threads']} | {r[new]['tokens_per_s']:,.0f} | "
                  f"{r[base]['tokens_per_s']:,.0f} | {r['ratio']:.2f}x | "
                  f"{r[new]['median_ms']:.1f} | {r[base]['median_ms']:.1f} |")
    elif not args.json:
        ratio_head = f"{new}/{base}"
        print(f"{'threads':>7}  {'side':>8}  {'tokens/s':>10}  {'median ms':>9}  "
              f"{'IQR ms':>13}  {ratio_head:>15}")
        for r in results:
            for side in (new, base):
                s = r[side]
                ratio = f"{r['ratio']:.2f}x" if side == new else ""
                print(f"{r['threads']:>7}  {side:>8}  {s['tokens_per_s']:>10,.0f}  "
                      f"{s['median_ms']:>9.1f}  {s['q1_ms']:>6.1f}-{s['q3_ms']:<6.1f}  "
                      f"{ratio:>15}")
    # Under autocast the two sides round differently (our ops compute in float32; a low type
    # against float32 rounds every matrix product).
    exact = args.dtype == "float32"
    warn_if_losses_differ(results, new, base, tol=1e-3 if exact else 3e-2)


if __name__ == "__main__":
    main()
