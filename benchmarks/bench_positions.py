#!/usr/bin/env python
"""Position encodings compared on the `baby` GPT (issue 14): quality and speed at its own
context, and length generalisation, in the spirit of Kazemnejad et al., "The Impact of Positional
Encoding on Length Generalization in Transformers" (NeurIPS 2023).

For each --pos-encoding (learned, sinusoidal, rotary, relative, alibi, none):
1. `python -m pygpt.train --pos-encoding E --max-iters STEPS --seed 1` trains the baby preset
   (context 64, char tokenizer, the shipped Shakespeare) in a subprocess, as a user would; the
   first table gives the last line of its metrics.jsonl (val loss, tokens/s) and the wall time.
2. Its checkpoint is rebuilt with context 128 and 256 (dataclasses.replace(cfg, block_size=L),
   the same weights; learned positions have no vector past 64: "n/a") and scored on the held-out
   last tenth of the text (the run's own val split), cut into consecutive windows of L tokens:
   the mean next-token loss over all positions of each window, and over the positions past 64
   only (the ones the model never saw in training: the extrapolation proper).
3. A synthetic task, copying: a tiny GPT (2 layers, 4 heads, 64 wide, context 40) of each
   encoding learns "x_1..x_n SEP x_1..x_n" (n from 1 to 20, symbols from 10; loss on the copy
   only) for --copy-steps steps, then copies greedily sequences of n = 10, 20, 30, 40 (context
   rebuilt to 80): exact-match accuracy over --copy-eval sequences. Same seeds for every encoding.

Usage:
  python benchmarks/bench_positions.py --threads 1 --workdir runs/bench-positions
  python benchmarks/bench_positions.py --encodings rotary alibi --steps 500
  python benchmarks/bench_positions.py --quick       # a smoke test of the whole pipeline
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from bench_bert import last_metrics, run
from machine import run_benchmark
from pygpt.storage.checkpoint import load
from pygpt.config import ModelConfig
from pygpt.data.text import TokenFile, TokenSplits
from pygpt.families import build
from pygpt.config.presets import preset

ENCODINGS = ["learned", "sinusoidal", "rotary", "relative", "alibi", "none"]
TRAIN_CONTEXT = preset("baby").model.block_size  # 64
EVAL_LENGTHS = [TRAIN_CONTEXT, 2 * TRAIN_CONTEXT, 4 * TRAIN_CONTEXT]
SYMBOLS, TRAIN_MAX_N, COPY_NS = 10, 20, [10, 20, 30, 40]
SEP = SYMBOLS  # the separator's token id; vocabulary: the symbols and SEP
QUICK = {"steps": 20, "copy_steps": 20, "copy_eval": 20, "eval_windows": 8}


def resized(model: torch.nn.Module, block_size: int) -> Optional[torch.nn.Module]:
    """The model rebuilt with another context length and the same weights (eval mode); None if
    its weights do not fit that length (learned positions: one vector per trained position)."""
    if block_size == model.config.block_size:
        return model.eval()
    if model.config.pos_encoding == "learned":
        return None
    bigger = build(dataclasses.replace(model.config, block_size=block_size))
    bigger.load_state_dict(model.state_dict())  # non-persistent tables are rebuilt to the size
    return bigger.eval()


@torch.no_grad()
def window_losses(model: torch.nn.Module, tokens: torch.Tensor, L: int, max_windows: int,
                  batch: int = 16) -> tuple[float, float]:
    """Mean next-token loss over consecutive windows of L tokens of `tokens` (L + 1 read per
    window): over all L positions, and over positions TRAIN_CONTEXT.. only (nan if none)."""
    n = min((len(tokens) - 1) // L, max_windows)
    total = torch.zeros(L, dtype=torch.float64)
    for i in range(0, n, batch):
        starts = torch.arange(i, min(i + batch, n)) * L
        w = tokens[starts[:, None] + torch.arange(L + 1)]
        logits = model(w[:, :-1]).logits
        ce = F.cross_entropy(logits.transpose(1, 2).float(), w[:, 1:], reduction="none")
        total += ce.double().sum(0)
    per_position = total / n
    past = per_position[TRAIN_CONTEXT:].mean().item() if L > TRAIN_CONTEXT else math.nan
    return per_position.mean().item(), past


def copy_batch(n: int, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (batch, 2n) of x_1..x_n SEP x_1..x_{n-1} and targets with -100 except the copy."""
    x = torch.randint(SYMBOLS, (batch, n), generator=g)
    seq = torch.cat([x, torch.full((batch, 1), SEP), x], dim=1)
    targets = seq[:, 1:].clone()
    targets[:, :n] = -100  # predicting the source and SEP is not the task
    return seq[:, :-1], targets


def train_copier(encoding: str, steps: int, seed: int, batch: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(vocab_size=SYMBOLS + 1, block_size=2 * TRAIN_MAX_N, n_layer=2, n_head=4,
                      n_embd=64, pos_encoding=encoding)
    model = build(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    for _ in range(steps):
        n = int(torch.randint(1, TRAIN_MAX_N + 1, (1,), generator=g))
        x, y = copy_batch(n, batch, g)
        logits = model(x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval()


@torch.no_grad()
def copy_accuracy(model: Optional[torch.nn.Module], n: int, count: int, seed: int) -> float:
    """The fraction of `count` sequences of n symbols whose greedy copy is exact."""
    x, _ = copy_batch(n, count, torch.Generator().manual_seed(seed + n))
    seq = x[:, : n + 1]  # the source and SEP
    for _ in range(n):
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return (seq[:, n + 1:] == x[:, :n]).all(1).float().mean().item()


def fmt(value: Optional[float], spec: str = ".4f") -> str:
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--encodings", nargs="+", choices=ENCODINGS, default=ENCODINGS,
                   help="the position encodings to compare")
    p.add_argument("--steps", type=int, default=preset("baby").train.max_iters,
                   help="training steps of each baby GPT")
    p.add_argument("--copy-steps", type=int, default=6000,
                   help="training steps of each copying model (0: no copying table)")
    p.add_argument("--copy-eval", type=int, default=500,
                   help="sequences copied per encoding and length")
    p.add_argument("--eval-windows", type=int, default=10**9,
                   help="at most this many held-out windows per length (default: all)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=1, help="seed of every run")
    p.add_argument("--workdir", default=None, help="folder for the runs and logs, kept "
                                                   "(default: a temporary folder, removed)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke test: {QUICK['steps']} steps, {QUICK['copy_steps']} copying "
                        "steps, few evaluation windows (the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if min(args.steps, args.copy_eval, args.eval_windows, args.threads) < 1 or args.copy_steps < 0:
        p.error("--steps, --copy-eval, --eval-windows and --threads must be at least 1, "
                "--copy-steps at least 0")
    if len(set(args.encodings)) != len(args.encodings):
        p.error(f"--encodings must differ, got {args.encodings}")
    return args


def bench(args: argparse.Namespace, work: Path) -> None:
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    common = ["--max-iters", str(args.steps), "--threads", str(args.threads), "--quiet",
              "--overwrite", "--seed", str(args.seed)] + (["--eval-iters", "2"] if args.quick
                                                          else [])
    print(f"\n## The baby GPT ({TRAIN_CONTEXT} context) by position encoding, {args.steps} "
          "steps\n")
    print("| encoding | val loss | tokens/s | wall s |")
    print("|---|---:|---:|---:|", flush=True)
    for e in args.encodings:
        wall = run(["pygpt.train", "--pos-encoding", e, "--out", str(work / e), *common],
                   logs / f"{e}.log")
        m = last_metrics(work / e)
        print(f"| {e} | {m['val_loss']:.4f} | {m['tokens_per_s']:,.0f} | {wall:.1f} |",
              flush=True)

    print(f"\n## Length generalisation: trained at context {TRAIN_CONTEXT}, mean next-token loss "
          "on the held-out tenth of the text in windows of L tokens (all positions; in brackets "
          f"the positions past {TRAIN_CONTEXT} only)\n")
    print("| encoding | " + " | ".join(f"L = {L}" for L in EVAL_LENGTHS) + " |")
    print("|---|" + "---:|" * len(EVAL_LENGTHS), flush=True)
    for e in args.encodings:
        model, tokenizer = load(work / e)
        tokens = torch.from_numpy(TokenSplits(TokenFile.load(None, tokenizer).tokens,
                                              TRAIN_CONTEXT).splits["val"].astype("int64"))
        cells = []
        for L in EVAL_LENGTHS:
            sized = resized(model, L)
            if sized is None:
                cells.append("n/a")
                continue
            every, past = window_losses(sized, tokens, L, args.eval_windows)
            cells.append(fmt(every) + ("" if math.isnan(past) else f" ({fmt(past)})"))
        print(f"| {e} | " + " | ".join(cells) + " |", flush=True)

    if not args.copy_steps:
        return
    print(f"\n## Copying: trained on n <= {TRAIN_MAX_N} symbols ({args.copy_steps} steps, "
          f"context {2 * TRAIN_MAX_N}), exact-match accuracy of greedy copies of "
          f"{args.copy_eval} sequences of n symbols\n")
    print("| encoding | " + " | ".join(f"n = {n}" for n in COPY_NS) + " | train s |")
    print("|---|" + "---:|" * (len(COPY_NS) + 1), flush=True)
    for e in args.encodings:
        t0 = time.perf_counter()
        model = train_copier(e, args.copy_steps, args.seed)
        wall = time.perf_counter() - t0
        cells = []
        for n in COPY_NS:
            sized = resized(model, 2 * max(n, TRAIN_MAX_N))
            cells.append(fmt(None if sized is None else copy_accuracy(sized, n, args.copy_eval,
                                                                      args.seed), ".3f"))
        print(f"| {e} | " + " | ".join(cells) + f" | {wall:.1f} |", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    run_benchmark("bench_positions", args, bench, threads=str(args.threads))
    print(f"\n# total wall time: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
