"""Training: `python -m pygpt.train` trains a GPT on a text file (by default the tiny-Shakespeare
text shipped in the package) and writes a checkpoint folder that pygpt.generate, pygpt.load and
the ONNX exporter read.

The loop: random context windows from the 90/10 train split, AdamW (or SGD) with linear warmup
and a warmup-stable-decay (or cosine, or constant) schedule, gradient accumulation and clipping; every --eval-interval steps the mean loss
over fixed batches of both splits is logged (metrics.jsonl) and the checkpoint saved. --resume
continues a run exactly: weights, optimizer, step, and the RNG states of data order and dropout
all come back, so a run stopped after N steps and resumed for M more ends with the weights of
N + M straight. (The schedule ends at --lr-decay-iters, by default --max-iters: resuming with a
larger --max-iters stretches the remaining schedule.) Ctrl-C stops at the end of the current
step and saves, ready for --resume.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from tqdm import tqdm

from pygpt import checkpoint
from pygpt.cli import add_dataclass_flags, overrides
from pygpt.config import PRESETS, ModelConfig, TrainConfig, config_from_dict, preset
from pygpt.data import TokenFile, TokenSplits, read_chunks
from pygpt.model import GPT
from pygpt.plot import METRICS, plot_runs
from pygpt.tokenizer import (BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer,
                             tokenizer_from_json)

DEFAULT_BPE_VOCAB = 1024
PLOT = "loss.png"


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cfg.schedule down to cfg.min_lr at lr_decay_iters."""
    if step < cfg.warmup_iters:
        return cfg.lr * (step + 1) / cfg.warmup_iters
    end = cfg.lr_decay_iters if cfg.lr_decay_iters is not None else cfg.max_iters
    if cfg.schedule == "constant":
        return cfg.lr
    if step >= end:
        return cfg.min_lr
    if cfg.schedule == "wsd":
        cooldown_start = end - cfg.cooldown_frac * end
        if step < cooldown_start:
            return cfg.lr
        progress = (step - cooldown_start) / max(1.0, end - cooldown_start)
        return cfg.lr + progress * (cfg.min_lr - cfg.lr)
    progress = (step - cfg.warmup_iters) / max(1, end - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW decays only the weights of linear layers (not norms, biases or embeddings, which
    includes a tied LM head); SGD is plain."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = {id(m.weight): m.weight for m in model.modules()
             if isinstance(m, torch.nn.Linear) and id(m.weight) not in embeddings}
    rest = [p for p in model.parameters() if id(p) not in decay]
    groups = [{"params": list(decay.values()), "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


@torch.no_grad()
def evaluate(model: GPT, splits: TokenSplits, cfg: TrainConfig, chars_per_token: float = 1.0,
             batch_size: Optional[int] = None) -> dict[str, float]:
    """Mean loss per split over the same eval_iters batches every time (their own generator, so
    evaluating never changes the training data order), in nats per token and in bits per
    character (comparable across tokenizers)."""
    model.eval()
    result = {}
    for i, split in enumerate(("train", "val")):
        gen = torch.Generator().manual_seed(cfg.seed + 1 + i)
        losses = [model(*splits.batch(split, batch_size or cfg.batch_size, gen)).loss.item()
                  for _ in range(cfg.eval_iters)]
        result[f"{split}_loss"] = sum(losses) / len(losses)
        result[f"{split}_bpc"] = result[f"{split}_loss"] / math.log(2) / chars_per_token
    model.train()
    return result


def make_tokenizer(model_cfg: ModelConfig, cfg: TrainConfig, resume: bool) -> Tokenizer:
    """The run's own tokenizer when resuming, the source's when fine-tuning, else a new one
    learned from the data."""
    if resume:
        return load_tokenizer(Path(cfg.out) / checkpoint.TOKENIZER)
    if cfg.init_from is not None:
        return load_tokenizer(Path(cfg.init_from) / checkpoint.TOKENIZER)
    if cfg.tokenizer == "bpe":
        return BPETokenizer.train(read_chunks(cfg.data), model_cfg.vocab_size)
    return CharTokenizer.from_text(read_chunks(cfg.data))


class Distributed:
    """Multi-process data parallelism on PyTorch's own engine: under torchrun (which sets
    WORLD_SIZE, RANK and the rendezvous address) the ranks join a process group (gloo on CPU,
    NCCL on GPU) and the model is wrapped in DistributedDataParallel. With one process every
    method is a no-op, so the training loop reads the same either way."""

    @staticmethod
    def start(device: str) -> tuple[int, int]:
        """(rank, world size)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return 0, 1
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        return dist.get_rank(), world

    @staticmethod
    def share_tokenizer(tokenizer: Optional[Tokenizer], world: int) -> Tokenizer:
        if world == 1:
            return tokenizer
        payload = [tokenizer.to_json() if tokenizer is not None else None]
        dist.broadcast_object_list(payload, src=0)
        return tokenizer or tokenizer_from_json(payload[0], "rank 0's tokenizer")

    @staticmethod
    def barrier(world: int) -> None:
        if world > 1:
            dist.barrier()

    @staticmethod
    def wrap(model: torch.nn.Module, world: int) -> torch.nn.Module:
        if world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    @staticmethod
    def no_sync(model: torch.nn.Module, world: int, skip: bool):
        """Inside, backward does not all-reduce (for all but the last micro-batch)."""
        return model.no_sync() if world > 1 and skip else contextlib.nullcontext()

    @staticmethod
    def stop(world: int) -> None:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


class _StopRequest:
    """First Ctrl-C asks the loop to stop after the current step; a second one interrupts."""

    def __init__(self) -> None:
        self.requested = False

    def __enter__(self) -> "_StopRequest":
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, *_: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous)

    def __exit__(self, *_: Any) -> None:
        signal.signal(signal.SIGINT, self._previous)


def _append_metrics(out: Path, record: dict[str, Any]) -> None:
    with open(out / METRICS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _truncate_metrics(out: Path, step: int) -> None:
    """Drops records past `step`, left by a run that was killed after its last checkpoint."""
    path = out / METRICS
    if path.exists():
        kept = [l for l in path.read_text(encoding="utf-8").splitlines()
                if l.strip() and json.loads(l)["step"] <= step]
        path.write_text("".join(l + "\n" for l in kept), encoding="utf-8")


def train(model_cfg: ModelConfig, cfg: TrainConfig, *, resume: bool = False,
          progress: bool = True) -> dict[str, Any]:
    """Runs (or with resume, continues) a training run into cfg.out; returns the last metrics."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    rank, world = Distributed.start(cfg.device)
    is_main = rank == 0
    # Rank 0 learns the tokenizer and writes the token cache; the others take both from it.
    tokenizer = make_tokenizer(model_cfg, cfg, resume) if is_main else None
    tokenizer = Distributed.share_tokenizer(tokenizer, world)
    cfg = dataclasses.replace(cfg, tokenizer=tokenizer.kind)  # what the run really uses
    token_file = TokenFile.load(cfg.data, tokenizer) if is_main else None
    Distributed.barrier(world)
    token_file = token_file or TokenFile.load(cfg.data, tokenizer)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    splits = TokenSplits(token_file.tokens, model_cfg.block_size)

    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg, kernels=cfg.kernels).to(cfg.device)
    optimizer = make_optimizer(model, cfg)
    data_gen = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if cfg.init_from is not None and not resume:
        source, _ = checkpoint.load(cfg.init_from, kernels=cfg.kernels, device=cfg.device)
        model.load_state_dict(source.state_dict())
    if resume:
        loaded, _ = checkpoint.load(out, kernels=cfg.kernels, device=cfg.device)
        model.load_state_dict(loaded.state_dict())
        state = checkpoint.load_train_state(out)
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        data_gen.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        if is_main:
            _truncate_metrics(out, step)
    if world > 1:  # each rank its own dropout masks
        torch.manual_seed(cfg.seed + 1_000_003 * rank + step)
    model.train()
    step_model = Distributed.wrap(model, world)
    step_model = torch.compile(step_model) if cfg.compile else step_model

    def save() -> None:
        state = {"optimizer": optimizer.state_dict(), "data_rng": data_gen.get_state(),
                 "torch_rng": torch.get_rng_state()}
        checkpoint.save(out, model, tokenizer, cfg, state, step=step)

    tokens_per_step = cfg.batch_size * cfg.grad_accum * world * model_cfg.block_size
    last: dict[str, Any] = {"step": step}
    train_time, t_start = 0.0, time.perf_counter()
    bar = tqdm(total=cfg.max_iters, initial=step, disable=not (progress and is_main), unit="step",
               dynamic_ncols=True, mininterval=0.5)
    with _StopRequest() as stop:
        while step < cfg.max_iters and not stop.requested:
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = 0.0
            for micro in range(cfg.grad_accum):
                # Every rank draws the same global batch and trains on its own slice of it, so
                # N ranks of batch B step exactly like one process of batch N * B.
                x, y = splits.batch("train", cfg.batch_size * world, data_gen)
                mine = slice(rank * cfg.batch_size, (rank + 1) * cfg.batch_size)
                last_micro = micro == cfg.grad_accum - 1
                with Distributed.no_sync(step_model, world, skip=not last_micro):
                    loss = step_model(x[mine].to(cfg.device),
                                      y[mine].to(cfg.device)).loss / cfg.grad_accum
                    loss.backward()
                loss_sum += loss.item()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            dt = time.perf_counter() - t0
            train_time += dt
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum:.4f}", tok_s=f"{tokens_per_step / dt:,.0f}",
                            refresh=False)
            if step % cfg.eval_interval == 0 or step == cfg.max_iters or stop.requested:
                last = {"step": step, "tokens": step * tokens_per_step, "lr": lr,
                        **evaluate(model, splits, cfg, token_file.chars_per_token,
                                   batch_size=cfg.batch_size * world),
                        "tokens_per_s": (tokens_per_step * (step - (last.get("step") or 0)))
                        / max(train_time, 1e-9),
                        "elapsed_s": time.perf_counter() - t_start}
                last["train_ppl"] = math.exp(last["train_loss"])
                last["val_ppl"] = math.exp(last["val_loss"])
                train_time = 0.0
                if not is_main:
                    continue
                save()
                _append_metrics(out, last)
                bar.write(f"step {step}: train loss {last['train_loss']:.4f}, val loss "
                          f"{last['val_loss']:.4f} (ppl {last['val_ppl']:.2f}, "
                          f"{last['val_bpc']:.3f} bits/char), "
                          f"{last['tokens_per_s']:,.0f} tokens/s")
    bar.close()
    Distributed.stop(world)
    if is_main and (out / METRICS).exists():
        try:
            plot_runs([out], out / PLOT)
        except (OSError, ValueError) as e:  # a picture is not worth failing a finished run
            print(f"warning: could not draw {out / PLOT}: {e}", file=sys.stderr)
    if stop.requested:
        print(f"stopped at step {step}; continue with --resume --out {out}", file=sys.stderr)
    return last


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pygpt.train",
        description="Train a GPT on a text file with pygpt's kernels. Flags not given come from "
                    "the preset (or, with --resume, from the checkpoint being continued).",
        epilog="presets: " + "; ".join(
            f"{name}: {p.model.n_layer} layers, {p.model.n_head} heads, {p.model.n_embd} wide, "
            f"context {p.model.block_size}, batch {p.train.batch_size}, {p.train.max_iters} iters"
            for name, p in PRESETS.items()))
    parser.add_argument("--preset", choices=list(PRESETS), default="baby",
                        help="starting configuration (default: baby)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run saved in --out (exactly where it stopped)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run even if --out already holds a checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_dataclass_flags(parser, ModelConfig, "model")
    add_dataclass_flags(parser, TrainConfig, "training")
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    model_flags, train_flags = overrides(args, ModelConfig), overrides(args, TrainConfig)
    out = Path(train_flags.get("out", TrainConfig.out))
    if args.resume:
        saved = checkpoint.read_config(out)
        if model_flags:
            raise SystemExit(f"--resume continues the saved model; model flags cannot change "
                             f"({', '.join('--' + k.replace('_', '-') for k in model_flags)})")
        try:
            model_cfg = config_from_dict(ModelConfig, saved["model"])
            saved_train = config_from_dict(TrainConfig, saved.get("train"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{out / checkpoint.CONFIG}: cannot resume: {e}") from None
        # The folder being resumed is where the run continues, wherever it was first written.
        train_flags.setdefault("out", str(out))
        return model_cfg, dataclasses.replace(saved_train, **train_flags)
    init_from = train_flags.get("init_from")
    if init_from is not None and Path(init_from).resolve() == out.resolve():
        raise SystemExit("--init-from and --out must differ: the source checkpoint is never "
                         "modified; fine-tuning writes its own folder")
    if (out / checkpoint.WEIGHTS).exists() and not args.overwrite:
        raise SystemExit(f"{out} already holds a checkpoint; pass --resume to continue it, "
                         "--overwrite to start over, or --out to train elsewhere")
    base = preset(args.preset)
    train_cfg = dataclasses.replace(base.train, **train_flags)
    if train_cfg.init_from is not None:
        return _fine_tune_model(train_cfg, model_flags, train_flags), train_cfg
    if "vocab_size" in model_flags and train_cfg.tokenizer == "char":
        raise SystemExit("--vocab-size sets the size of a BPE vocabulary (--tokenizer bpe); a char "
                         "tokenizer takes its vocabulary from the text")
    if train_cfg.tokenizer == "bpe":
        model_flags.setdefault("vocab_size", DEFAULT_BPE_VOCAB)
    return dataclasses.replace(base.model, **model_flags), train_cfg


def _fine_tune_model(train_cfg: TrainConfig, model_flags: dict[str, Any],
                     overrides_given: dict[str, Any]) -> ModelConfig:
    """The source checkpoint's model; only dropout may change for fine-tuning."""
    source = Path(train_cfg.init_from)
    if "tokenizer" in overrides_given:
        raise SystemExit("--init-from keeps the source's tokenizer; --tokenizer cannot change it")
    changed = sorted(set(model_flags) - {"dropout"})
    if changed:
        raise SystemExit("--init-from keeps the source model's shape; these flags cannot change "
                         f"it: {', '.join('--' + k.replace('_', '-') for k in changed)}")
    try:
        model_cfg = config_from_dict(ModelConfig, checkpoint.read_config(source)["model"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source / checkpoint.CONFIG}: cannot fine-tune from it: {e}") from None
    return dataclasses.replace(model_cfg, **model_flags)


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        model_cfg, train_cfg = configs_from_args(args)
        if args.overwrite and not args.resume:
            (Path(train_cfg.out) / METRICS).unlink(missing_ok=True)
        result = train(model_cfg, train_cfg, resume=args.resume, progress=not args.quiet)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(result))


if __name__ == "__main__":
    main()
