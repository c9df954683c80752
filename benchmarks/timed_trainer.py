"""The training step the benchmarks time: pygpt.train's own optimizer step (schedule, gradient
accumulation, clipping, AdamW), on one model, optionally through torch.compile."""
import argparse
import dataclasses
import os
import statistics
import time

import torch

from machine import cpu_model, isa_note, use_isa
from pygpt.config import DTYPES
from pygpt.config.presets import PRESETS, preset
from pygpt.data.text import TokenSplits, read_text
from pygpt.mixed_precision import autocast, grad_scaler
from pygpt.models import GPT
from pygpt.tokenizer import CharTokenizer
from pygpt.training import lr_at, make_optimizer, train_step


def shakespeare_steps(model_cfg, train_cfg, n_steps, seed=0):
    """What every timed trainer starts from: the model config with the shipped text's char
    vocabulary, n_steps lists of grad_accum (x, y) batches drawn beforehand, and one initial
    state dict, so all trainers see the same weights and data."""
    text = read_text(None)
    tokenizer = CharTokenizer.from_text(text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    splits = TokenSplits(torch.tensor(tokenizer.encode(text)), model_cfg.block_size)
    gen = torch.Generator().manual_seed(seed)
    step_batches = [[splits.batch("train", train_cfg.batch_size, gen)
                     for _ in range(train_cfg.grad_accum)] for _ in range(n_steps)]
    torch.manual_seed(seed)
    return model_cfg, step_batches, GPT(model_cfg).state_dict()


def describe_run(name, model_cfg, train_cfg, details):
    """The two comment lines every training benchmark starts with: the shape, and the machine."""
    print(f"# preset {name}: {model_cfg.n_layer} layers, {model_cfg.n_head} heads, "
          f"{model_cfg.n_embd} wide, context {model_cfg.block_size}, dropout {model_cfg.dropout}, "
          f"batch {train_cfg.batch_size} x {train_cfg.grad_accum}, {train_cfg.optimizer}; "
          f"{details}")
    print(f"# torch {torch.__version__}, {cpu_model()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}; {isa_note()}")


class Trainer:
    """One model + optimizer; step() is one timed optimizer step of the (maybe compiled) model."""

    def __init__(self, model_cfg, train_cfg, kernels, init_state, compile_mode=False):
        """compile_mode: False for eager, else torch.compile's mode (None: its default)."""
        self.model = GPT(model_cfg, kernels=kernels)
        self.model.load_state_dict(init_state)
        self.model.train()
        self.step_model = (torch.compile(self.model, mode=compile_mode)
                           if compile_mode is not False else self.model)
        self.cfg = train_cfg
        self.optimizer = make_optimizer(self.model, train_cfg)
        self.scaler = grad_scaler("cpu", train_cfg.dtype or "float32")
        self.step_no = 0

    def step(self, batches):
        """batches: grad_accum (x, y) pairs. Returns (seconds, loss)."""
        t0 = time.perf_counter()
        total = train_step(self.model, self.optimizer, batches, lr_at(self.step_no, self.cfg),
                           self.cfg.grad_clip, forward=self.step_model,
                           autocast=lambda: autocast("cpu", self.cfg.dtype or "float32"),
                           scaler=self.scaler)
        dt = time.perf_counter() - t0
        self.step_no += 1
        return dt, total


def interleaved_steps(trainers, step_batches, start, steps, block):
    """Runs `steps` steps of every trainer on the same batches (step_batches[start:]), in blocks
    of `block` steps per trainer in turn, so a change in the machine's load hits all alike.
    Returns each trainer's step times and losses."""
    times = {name: [] for name in trainers}
    losses = {name: [] for name in trainers}
    done = 0
    while done < steps:
        n = min(block, steps - done)
        for name, trainer in trainers.items():
            for i in range(start + done, start + done + n):
                dt, loss = trainer.step(step_batches[i])
                times[name].append(dt)
                losses[name].append(loss)
        done += n
    return times, losses


def step_stats(times, tokens_per_step):
    """Median and quartiles of step times (ms) and tokens/s from the median."""
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [med, med, med]
    return {"median_ms": med * 1e3, "q1_ms": q[0] * 1e3, "q3_ms": q[2] * 1e3,
            "tokens_per_s": tokens_per_step / med}


def compare(times, losses, tokens_per_step, new, base):
    """Step statistics and final loss of each side, the tokens/s ratio new / base, and the
    largest difference between the two sides' losses (the same weights and data must learn the
    same thing)."""
    result = {side: {**step_stats(times[side], tokens_per_step), "final_loss": losses[side][-1]}
              for side in (new, base)}
    result["ratio"] = result[new]["tokens_per_s"] / result[base]["tokens_per_s"]
    result["max_loss_diff"] = max(abs(a - b) for a, b in zip(losses[new], losses[base]))
    return result


def parser(doc, side, threads, steps, warmup, warmup_help):
    """The flags every training benchmark takes: the preset and its overrides, thread counts,
    steps, blocks and output format. `side` names what alternates (a kernel set, a mode)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="baby",
                   help="model shape and training settings (default: baby)")
    p.add_argument("--threads", type=int, nargs="+", default=threads,
                   help=f"intra-op thread counts to run (default: {' '.join(map(str, threads))})")
    p.add_argument("--steps", type=int, default=steps, help=f"timed steps per {side}")
    p.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    p.add_argument("--block", type=int, default=10, help=f"steps per block before switching {side}")
    p.add_argument("--batch-size", type=int, default=None, help="override the preset's batch")
    p.add_argument("--block-size", type=int, default=None,
                   help="override the preset's context length")
    p.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="number type of the matrix products (autocast; default float32)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON lines")
    p.add_argument("--isa", choices=["avx512", "avx2", "base"], default=None,
                   help="our kernels' ISA, and ATen's and MKL's (default: the best for this CPU)")
    return p


def parse(p, argv):
    """(args, model_cfg, train_cfg): the preset with the command line's overrides."""
    args = p.parse_args(argv)
    use_isa(args.isa)
    if args.steps < 1 or args.warmup < 0 or args.block < 1:
        p.error("--steps and --block must be >= 1, --warmup >= 0")
    chosen = preset(args.preset)
    model_cfg, train_cfg = chosen.model, dataclasses.replace(chosen.train, dtype=args.dtype)
    if args.block_size is not None:
        model_cfg = dataclasses.replace(model_cfg, block_size=args.block_size)
    if args.dropout is not None:
        model_cfg = dataclasses.replace(model_cfg, dropout=args.dropout)
    if args.batch_size is not None:
        train_cfg = dataclasses.replace(train_cfg, batch_size=args.batch_size)
    return args, model_cfg, train_cfg


def warn_if_losses_differ(results, new, base, tol=1e-3):
    for r in results:
        if r["max_loss_diff"] > tol:
            print(f"# WARNING: at {r['threads']} threads the {new} and {base} losses differ by "
                  f"{r['max_loss_diff']:.2e}")
