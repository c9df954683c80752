#!/usr/bin/env python
"""Structured pruning of a GPT, measured: for the unpruned run and each pruning (heads kept per
layer, MLP fraction removed; optionally recovered by fine-tuning), the parameters, the ONNX
file size, the latency of the torch-free runner at batch 1 on 1 thread (median wall time of
one decode step after a prompt, and generated tokens/s), and quality (the run's val loss, as
pygpt.training.evaluate reports it, on the same batches for every row).

Each pruned model comes from `python -m pygpt.prune` (the command users run), exported with
pygpt.export and stepped with pygpt_runtime.run_onnx.OnnxGPT, all in a temporary folder.

Usage:
  python benchmarks/bench_prune.py --ckpt out/                 # the baby run of pygpt.train
  python benchmarks/bench_prune.py --ckpt out/ --sizes 2:0.5 1:0.75 --recover-iters 200
  python benchmarks/bench_prune.py --small                     # a smoke run: trains a tiny GPT
Covers the GPT only; a BERT's or translator's pruned runs are measured by bench_bert.py's and
bench_translate.py's quality figures on the pruned folder.
"""

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from machine import busy_warning
import pygpt.prune
from pygpt.storage import checkpoint, export
from pygpt.config import ModelConfig, TrainConfig
from pygpt.config.fields import config_from_dict
from pygpt.families import family
from pygpt.training import evaluate, train
from pygpt.training.distributed import Distributed
from pygpt_runtime.run_onnx import OnnxGPT


def quality(ckpt: Path) -> float:
    """The run's val loss on its own data (the same fixed batches for every row)."""
    model, tokenizer = checkpoint.load(ckpt)
    cfg = config_from_dict(TrainConfig, checkpoint.read_config(ckpt)["train"])
    task = family(model.config.arch).make_task(model.config, cfg, tokenizer, Distributed("cpu"),
                                               None)
    return evaluate(model, task, cfg, model_metrics=False)["val_loss"]


def latency(onnx_dir: Path, prompt_tokens: int, new_tokens: int, repeat: int) -> tuple[float, float]:
    """(median ms of one decode step, tokens/s of a greedy generation) at batch 1, 1 thread."""
    runner = OnnxGPT(str(onnx_dir), threads=1)
    ids = np.zeros((1, prompt_tokens), dtype=np.int64)
    steps, totals = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        logits, past = runner.step(ids, runner.empty_past(1))
        for _ in range(new_tokens):
            t1 = time.perf_counter()
            logits, past = runner.step(logits[:, -1:].argmax(-1), past)
            steps.append(time.perf_counter() - t1)
        totals.append(time.perf_counter() - t0)
    return statistics.median(steps) * 1e3, new_tokens / statistics.median(totals)


def row(name: str, ckpt: Path, work: Path, args: argparse.Namespace) -> str:
    model, _ = checkpoint.load(ckpt)
    onnx_dir = work / f"{name}-onnx"
    export.export(ckpt, onnx_dir)
    size = (onnx_dir / "model.onnx").stat().st_size / 1e6
    step_ms, tokens_s = latency(onnx_dir, args.prompt_tokens, args.new_tokens, args.repeat)
    cfg = model.config
    return (f"| {name} | {cfg.n_head} | {cfg.mlp_width} | "
            f"{sum(p.numel() for p in model.parameters()):,} | {size:.2f} | {step_ms:.3f} | "
            f"{tokens_s:,.0f} | {quality(ckpt):.4f} |")


def small_run(work: Path) -> Path:
    """A tiny GPT trained a few steps on the shipped text (the smoke test's run)."""
    out = work / "small"
    cfg = TrainConfig(out=str(out), batch_size=4, max_iters=4, eval_interval=4, eval_iters=2,
                      warmup_iters=1, threads=1)
    train(ModelConfig(n_layer=2, n_head=4, n_embd=32, block_size=16), cfg, progress=False)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", help="a GPT run folder (default with --small: a tiny one trained)")
    p.add_argument("--sizes", nargs="+", default=["2:0.5", "1:0.75"],
                   help="HEADS:MLP_FRACTION per pruned row (default 2:0.5 1:0.75)")
    p.add_argument("--recover-iters", type=int, default=0, help="fine-tune each pruned run")
    p.add_argument("--batches", type=int, default=8, help="batches the importance is scored on")
    p.add_argument("--prompt-tokens", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=50)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--small", action="store_true", help="a smoke run: a tiny model, few steps")
    args = p.parse_args()
    if args.small:
        args.sizes, args.new_tokens, args.repeat, args.prompt_tokens = ["2:0.5"], 4, 1, 2
    busy_warning([1])
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = Path(args.ckpt) if args.ckpt else small_run(work)
        print("| model | heads/layer | MLP width | parameters | ONNX MB | decode step ms "
              "| tokens/s | val loss |")
        print("|---|---|---|---|---|---|---|---|")
        print(row("unpruned", ckpt, work, args))
        for size in args.sizes:
            heads, fraction = size.split(":")
            out = work / f"pruned-{heads}-{fraction}"
            with contextlib.redirect_stdout(io.StringIO()):  # its report line: not the table's
                pygpt.prune.main(["--ckpt", str(ckpt), "--out", str(out), "--heads-per-layer",
                                  heads, "--mlp-fraction", fraction, "--recover-iters",
                                  str(args.recover_iters), "--batches", str(args.batches),
                                  "--threads", "1", "--quiet"])
            name = f"pruned {heads}:{fraction}" + (f" +{args.recover_iters} steps"
                                                   if args.recover_iters else "")
            print(row(name, out, work, args))


if __name__ == "__main__":
    main()
