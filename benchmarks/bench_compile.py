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

import json
import sys
import traceback

import torch

from machine import busy_warning
from timed_trainer import (Trainer, compare, describe_run, interleaved_steps, parse, parser,
                           shakespeare_steps, warn_if_losses_differ)
from pygpt.config import KERNEL_SETS

MODES = ("eager", "compiled")


def bench(model_cfg, train_cfg, kernels, threads, steps, warmup, block, compile_mode, seed=0):
    torch.set_num_threads(threads)
    torch._dynamo.reset()
    model_cfg, step_batches, init_state = shakespeare_steps(model_cfg, train_cfg,
                                                            1 + warmup + steps, seed)
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
    # Same data and weights: both must learn the same thing (up to float reassociation).
    return {"threads": threads, "kernels": kernels, "tokens_per_step": tokens_per_step,
            "params": trainers["eager"].model.num_params(),
            "compile_s": first["compiled"][0] - first["eager"][0],
            **compare(times, losses, tokens_per_step, "compiled", "eager")}


def main(argv=None):
    p = parser(__doc__, "mode", threads=[1], steps=40, warmup=3,
               warmup_help="untimed steps per mode after the compiling first step")
    p.add_argument("--kernels", choices=KERNEL_SETS, default="ext",
                   help="our C++ kernels (default) or plain PyTorch ops")
    p.add_argument("--mode", default=None,
                   help="torch.compile mode (default: its default; e.g. max-autotune-no-cudagraphs)")
    args, model_cfg, train_cfg = parse(p, argv)

    describe_run(args.preset, model_cfg, train_cfg,
                 f"kernels {args.kernels}, compile mode {args.mode or 'default'}; {args.steps} "
                 f"timed steps each after {args.warmup} warmup, blocks of {args.block}")
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
    warn_if_losses_differ(results, "eager", "compiled")


if __name__ == "__main__":
    main()
