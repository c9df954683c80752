#!/usr/bin/env python
"""Training throughput of the GPT on our kernels (`ext`) against plain PyTorch ops (`torch`).

One process trains the same model shape (a preset's; default `baby`: 4 layers, 128 wide,
batch 12, context 64) with each set of kernels and reports tokens/s and the ratio ext/torch
(> 1: ours is faster), for each requested intra-op thread count.

What is timed is one optimizer step exactly as pygpt.train runs it: forward with the loss,
backward, gradient clipping, the optimizer step (AdamW or SGD with the preset's settings, via
pygpt.train.make_optimizer) and zero_grad; the batches (random windows of the shipped
Shakespeare text) are drawn beforehand. Both models start from the same weights.

Timing: `--warmup` untimed steps per kernel set, then `--steps` timed steps each, in alternating
blocks of `--block` steps (ext, torch, ext, ...), so a load change on a busy machine hits both
alike. tokens/s = batch * context / median step time.

Usage:
  python benchmarks/bench_train.py                     # baby shape, 1 and 2 threads
  python benchmarks/bench_train.py --threads 1 --steps 100
  python benchmarks/bench_train.py --preset shakespeare --batch-size 8 --steps 10
  python benchmarks/bench_train.py --markdown
"""

import argparse
import dataclasses
import json
import os
import platform

import torch

from machine import busy_warning
from timed_trainer import Trainer, interleaved_steps, step_stats
from pygpt.config import PRESETS, preset
from pygpt.data import TokenSplits, read_text
from pygpt.model import GPT
from pygpt.tokenizer import CharTokenizer

KERNELS = ("ext", "torch")


def bench(model_cfg, train_cfg, threads, steps, warmup, block, seed=0):
    torch.set_num_threads(threads)
    text = read_text(None)
    tokenizer = CharTokenizer.from_text(text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    splits = TokenSplits(torch.tensor(tokenizer.encode(text)), model_cfg.block_size)
    gen = torch.Generator().manual_seed(seed)
    n_batches = (warmup + steps) * train_cfg.grad_accum
    batches = [splits.batch("train", train_cfg.batch_size, gen) for _ in range(n_batches)]
    step_batches = [batches[i:i + train_cfg.grad_accum]
                    for i in range(0, n_batches, train_cfg.grad_accum)]

    torch.manual_seed(seed)
    init_state = GPT(model_cfg).state_dict()
    trainers = {k: Trainer(model_cfg, train_cfg, k, init_state) for k in KERNELS}
    # Both see the same batches in the same order; steps alternate between the two in blocks.
    for i in range(warmup):
        for k in KERNELS:
            trainers[k].step(step_batches[i])
    times, losses = interleaved_steps(trainers, step_batches, warmup, steps, block)

    tokens_per_step = train_cfg.batch_size * train_cfg.grad_accum * model_cfg.block_size
    result = {"threads": threads, "tokens_per_step": tokens_per_step,
              "params": trainers["ext"].model.num_params()}
    for k in KERNELS:
        result[k] = {**step_stats(times[k], tokens_per_step), "final_loss": losses[k][-1]}
    result["ratio"] = result["ext"]["tokens_per_s"] / result["torch"]["tokens_per_s"]
    # Same data and weights: the two runs must also learn the same thing.
    result["max_loss_diff"] = max(abs(a - b) for a, b in zip(losses["ext"], losses["torch"]))
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="baby",
                   help="model shape and training settings (default: baby)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="intra-op thread counts to run (default: 1 2)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per kernel set")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per kernel set first")
    p.add_argument("--block", type=int, default=10,
                   help="steps per block before switching kernel set")
    p.add_argument("--batch-size", type=int, default=None, help="override the preset's batch")
    p.add_argument("--block-size", type=int, default=None,
                   help="override the preset's context length")
    p.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON lines")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.block < 1:
        p.error("--steps and --block must be >= 1, --warmup >= 0")

    chosen = preset(args.preset)
    model_cfg, train_cfg = chosen.model, chosen.train
    if args.block_size is not None:
        model_cfg = dataclasses.replace(model_cfg, block_size=args.block_size)
    if args.dropout is not None:
        model_cfg = dataclasses.replace(model_cfg, dropout=args.dropout)
    if args.batch_size is not None:
        train_cfg = dataclasses.replace(train_cfg, batch_size=args.batch_size)

    print(f"# preset {args.preset}: {model_cfg.n_layer} layers, {model_cfg.n_head} heads, "
          f"{model_cfg.n_embd} wide, context {model_cfg.block_size}, dropout {model_cfg.dropout}, "
          f"batch {train_cfg.batch_size} x {train_cfg.grad_accum}, {train_cfg.optimizer}; "
          f"{args.steps} timed steps each after {args.warmup} warmup, blocks of {args.block}")
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
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
    for r in results:
        if r["max_loss_diff"] > 1e-3:
            print(f"# WARNING: at {r['threads']} threads the ext and torch losses differ by "
                  f"{r['max_loss_diff']:.2e}")


if __name__ == "__main__":
    main()
