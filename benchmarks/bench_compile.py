#!/usr/bin/env python
"""Training throughput of the GPT with and without torch.compile, on our kernels (`ext`).

One process trains the same model shape (a preset's; default `baby`: 4 layers, 128 wide,
batch 12, context 64) twice from the same weights on the same batches: eagerly, and through
`torch.compile(model)` exactly as `python -m pygpt.train --compile` does it (the model's forward
and backward are compiled; gradient clipping and the optimizer step stay eager). It reports
tokens/s of each and the ratio compiled/eager (> 1: compiling is faster), per thread count.

A timed step is one optimizer step as pygpt.train runs it: forward with the loss, backward,
clipping, the optimizer step and zero_grad; the batches are drawn beforehand. The first compiled
step includes the compilation, reported apart as "compile s"; `--warmup` untimed steps of each
follow, then `--steps` timed steps each in alternating blocks of `--block` (eager, compiled,
eager, ...), so a load change on a busy machine hits both alike. tokens/s = batch * context /
median step time. Each thread count compiles afresh (inductor's CPU code is generated for the
thread count it is compiled under).

Usage:
  python benchmarks/bench_compile.py                   # baby shape, 1 thread
  python benchmarks/bench_compile.py --threads 1 2
  python benchmarks/bench_compile.py --kernels torch   # the same for plain PyTorch ops
  python benchmarks/bench_compile.py --markdown
"""

import argparse
import dataclasses
import json
import os
import platform
import sys
import traceback

import torch

from machine import busy_warning
from timed_trainer import Trainer, interleaved_steps, step_stats
from pygpt.config import PRESETS, preset
from pygpt.data import TokenSplits, read_text
from pygpt.model import GPT
from pygpt.tokenizer import CharTokenizer

MODES = ("eager", "compiled")


def bench(model_cfg, train_cfg, kernels, threads, steps, warmup, block, compile_mode, seed=0):
    torch.set_num_threads(threads)
    torch._dynamo.reset()
    text = read_text(None)
    tokenizer = CharTokenizer.from_text(text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    splits = TokenSplits(torch.tensor(tokenizer.encode(text)), model_cfg.block_size)
    gen = torch.Generator().manual_seed(seed)
    n_steps = 1 + warmup + steps
    n_batches = n_steps * train_cfg.grad_accum
    batches = [splits.batch("train", train_cfg.batch_size, gen) for _ in range(n_batches)]
    step_batches = [batches[i:i + train_cfg.grad_accum]
                    for i in range(0, n_batches, train_cfg.grad_accum)]

    torch.manual_seed(seed)
    init_state = GPT(model_cfg).state_dict()
    trainers = {"eager": Trainer(model_cfg, train_cfg, kernels, init_state, compile_mode=False),
                "compiled": Trainer(model_cfg, train_cfg, kernels, init_state, compile_mode)}
    losses = {m: [] for m in MODES}
    # Step 0: the compiled model compiles its forward and backward here.
    first = {m: trainers[m].step(step_batches[0]) for m in MODES}
    for m in MODES:
        losses[m].append(first[m][1])
    for i in range(1, 1 + warmup):
        for m in MODES:
            losses[m].append(trainers[m].step(step_batches[i])[1])
    times, timed_losses = interleaved_steps(trainers, step_batches, 1 + warmup, steps, block)
    for m in MODES:
        losses[m] += timed_losses[m]

    tokens_per_step = train_cfg.batch_size * train_cfg.grad_accum * model_cfg.block_size
    result = {"threads": threads, "kernels": kernels, "tokens_per_step": tokens_per_step,
              "params": trainers["eager"].model.num_params(),
              "compile_s": first["compiled"][0] - first["eager"][0]}
    for m in MODES:
        result[m] = {**step_stats(times[m], tokens_per_step), "final_loss": losses[m][-1]}
    result["ratio"] = result["compiled"]["tokens_per_s"] / result["eager"]["tokens_per_s"]
    # Same data and weights: both must learn the same thing (up to float reassociation).
    result["max_loss_diff"] = max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"]))
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="baby",
                   help="model shape and training settings (default: baby)")
    p.add_argument("--kernels", choices=["ext", "torch"], default="ext",
                   help="our C++ kernels (default) or plain PyTorch ops")
    p.add_argument("--threads", type=int, nargs="+", default=[1],
                   help="intra-op thread counts to run (default: 1)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps per mode after the compiling first step")
    p.add_argument("--block", type=int, default=10, help="steps per block before switching mode")
    p.add_argument("--batch-size", type=int, default=None, help="override the preset's batch")
    p.add_argument("--mode", default=None,
                   help="torch.compile mode (default: its default; e.g. max-autotune-no-cudagraphs)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON lines")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.block < 1:
        p.error("--steps and --block must be >= 1, --warmup >= 0")

    chosen = preset(args.preset)
    model_cfg, train_cfg = chosen.model, chosen.train
    if args.batch_size is not None:
        train_cfg = dataclasses.replace(train_cfg, batch_size=args.batch_size)

    print(f"# preset {args.preset}: {model_cfg.n_layer} layers, {model_cfg.n_head} heads, "
          f"{model_cfg.n_embd} wide, context {model_cfg.block_size}, dropout {model_cfg.dropout}, "
          f"batch {train_cfg.batch_size} x {train_cfg.grad_accum}, {train_cfg.optimizer}; "
          f"kernels {args.kernels}, compile mode {args.mode or 'default'}; {args.steps} timed "
          f"steps each after {args.warmup} warmup, blocks of {args.block}")
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    busy_warning(args.threads)
    results = []
    for t in args.threads:
        try:
            results.append(bench(model_cfg, train_cfg, args.kernels, t, args.steps, args.warmup,
                                 args.block, args.mode))
        except Exception as e:  # a compile failure: say so plainly, with where it came from
            last = traceback.extract_tb(e.__traceback__)[-1]
            first_line = (str(e).strip().splitlines() or [""])[0]
            print(f"# ERROR at {t} thread(s): training through torch.compile failed: "
                  f"{type(e).__name__}: {first_line} ({last.filename}:{last.lineno})",
                  file=sys.stderr)
            for line in str(e).strip().splitlines()[1:4]:
                print(f"#   {line}", file=sys.stderr)
            sys.exit(1)
    if args.json:
        for r in results:
            print(json.dumps(r))
    if args.markdown:
        print("| threads | eager tokens/s | compiled tokens/s | compiled/eager | eager step (ms) | "
              "compiled step (ms) | compile (s) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['threads']} | {r['eager']['tokens_per_s']:,.0f} | "
                  f"{r['compiled']['tokens_per_s']:,.0f} | {r['ratio']:.2f}x | "
                  f"{r['eager']['median_ms']:.1f} | {r['compiled']['median_ms']:.1f} | "
                  f"{r['compile_s']:.1f} |")
    elif not args.json:
        print(f"{'threads':>7}  {'mode':>8}  {'tokens/s':>10}  {'median ms':>9}  "
              f"{'IQR ms':>13}  {'compiled/eager':>14}  {'compile s':>9}")
        for r in results:
            for m in MODES:
                s = r[m]
                extra = (f"{r['ratio']:>13.2f}x  {r['compile_s']:>9.1f}" if m == "compiled"
                         else f"{'':>14}  {'':>9}")
                print(f"{r['threads']:>7}  {m:>8}  {s['tokens_per_s']:>10,.0f}  "
                      f"{s['median_ms']:>9.1f}  {s['q1_ms']:>6.1f}-{s['q3_ms']:<6.1f}  {extra}")
    for r in results:
        if r["max_loss_diff"] > 1e-3:
            print(f"# WARNING: at {r['threads']} threads the eager and compiled losses differ by "
                  f"{r['max_loss_diff']:.2e}")


if __name__ == "__main__":
    main()
