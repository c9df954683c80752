"""A training run made ready: its tokenizer, task and labels, the model and optimizer (fresh,
fine-tuned from --init-from, or restored for --resume), the data order's generator and the
forward the steps call (with a teacher for distillation, wrapped for torchrun, compiled). What
pygpt.training.loop then runs; apart so that preparing a run reads apart from running it."""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from pygpt.config import ModelConfig, TrainConfig
from pygpt.families import Family, family
from pygpt.mixed_precision import autocast, default_dtype, grad_scaler, use_tf32
from pygpt.storage import checkpoint
from pygpt.storage.compat import stack_fused_states
from pygpt.tasks import Task
from pygpt.tokenizer import BPETokenizer, CharTokenizer, Tokenizer, WordPieceTokenizer
from pygpt.training.distill import Distillation, check_teacher, load_teacher
from pygpt.training.distributed import Distributed
from pygpt.training.metrics_log import truncate_metrics
from pygpt.training.optim import make_optimizer, schedule_end, warmup_warning


@dataclass
class Run:
    """Everything a run's steps, evaluations and saves use, and where it stands."""

    cfg: TrainConfig  # with the tokenizer kind the run really uses
    model_cfg: ModelConfig  # with the vocabulary (and a classifier's classes) of its data
    out: Path
    ranks: Distributed
    tokenizer: Tokenizer
    task: Task
    labels: Optional[list[str]]  # a classifier's, saved with each checkpoint
    model: torch.nn.Module  # the bare model: evaluated and saved
    optimizer: torch.optim.Optimizer
    forward: Callable[..., Any]  # what the steps call: the model, or its wrappers
    data_gen: torch.Generator  # the training data's order
    autocast: Callable[[], ContextManager]  # the context the model computes in (--dtype)
    scaler: Optional[torch.amp.GradScaler]  # float16's loss scaler
    step: int = 0
    tokens_seen: int = 0
    saved: Optional[int] = None  # the step of the checkpoint in out (None: not this run's yet)
    replacing: Sequence[str] = ()  # an earlier run's files the first save removes


def make_tokenizer(family: Family, model_cfg: ModelConfig, cfg: TrainConfig,
                   resume: bool) -> Tokenizer:
    """The run's own tokenizer when resuming, the source's when fine-tuning, the teacher's when
    distilling, else a new one learned from the family's text with the family's special
    tokens."""
    if resume:
        return checkpoint.read_tokenizer(cfg.out)
    if cfg.init_from is not None or cfg.distill_from is not None:
        return checkpoint.read_tokenizer(cfg.init_from or cfg.distill_from)
    text, specials = family.tokenizer_text(cfg), family.specials
    if cfg.tokenizer == "wordpiece":
        return WordPieceTokenizer.train(text, model_cfg.vocab_size)
    if cfg.tokenizer == "bpe":
        return BPETokenizer.train(text, model_cfg.vocab_size, specials=specials)
    return CharTokenizer.from_text(text, specials=specials)


def epoch_steps(cfg: TrainConfig, rows: int, world: int) -> int:
    """The steps of cfg.epochs passes over `rows` training rows, at cfg's batch (all ranks and
    micro-batches), rounded up; at least one."""
    return max(1, math.ceil(cfg.epochs * rows / (cfg.batch_size * cfg.grad_accum * world)))


def default_threads() -> int:
    """Half the CPUs this process may run on, at least 1: torch's own default (every core) spins
    its threads at each barrier and collapses as soon as another busy process shares the cores
    (100 baby steps beside a busy loop on a shared 2-core machine: 497-739 s at 2 threads,
    25-102 s at 1)."""
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    return max(1, cpus // 2)


def prepare(model_cfg: ModelConfig, cfg: TrainConfig, resume: bool, replacing: Sequence[str],
            say: Callable[[str], None]) -> Run:
    """The run of cfg (continued from cfg.out with resume), saying what it is as it goes
    (say: a line of the report, or nothing for a quiet run or another rank)."""
    torch.set_num_threads(cfg.threads if cfg.threads is not None else default_threads())
    cfg = dataclasses.replace(cfg, dtype=cfg.dtype or default_dtype(cfg.device))  # as saved
    use_tf32(cfg.device, cfg.dtype)
    ranks = Distributed(cfg.device)
    say = say if ranks.is_main else lambda line: None
    fam = family(model_cfg.arch)
    teacher = load_teacher(cfg, model_cfg) if cfg.distill_from is not None else None
    if not resume and cfg.init_from is None and cfg.distill_from is None:
        say(f"tokenizer: learning a {cfg.tokenizer} vocabulary from the data")
    # Rank 0 learns the tokenizer and writes the token cache; the others take both from it.
    tokenizer = ranks.share_tokenizer(make_tokenizer(fam, model_cfg, cfg, resume)
                                      if ranks.is_main else None)
    cfg = dataclasses.replace(cfg, tokenizer=tokenizer.kind)  # what the run really uses
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    source = cfg.out if resume else cfg.init_from  # whose labels a classifier keeps
    task = fam.make_task(model_cfg, cfg, tokenizer, ranks,
                         checkpoint.load_labels(cfg.out) if resume else None)
    say(f"data: {task.summary()}")
    if cfg.epochs is not None:
        cfg = dataclasses.replace(cfg, max_iters=epoch_steps(cfg, task.training_rows(),
                                                             ranks.world))
        say(f"epochs: {cfg.epochs:g} x {task.training_rows():,} rows = {cfg.max_iters:,} steps")
    if cfg.warmup_frac is not None:
        cfg = dataclasses.replace(cfg, warmup_iters=int(cfg.warmup_frac * schedule_end(cfg)))
        say(f"warmup: {cfg.warmup_frac:g} of {schedule_end(cfg):,} steps = "
            f"{cfg.warmup_iters:,} steps")
    model_cfg, labels = fam.prepare_config(
        model_cfg, cfg, task, (lambda: checkpoint.load_labels(source)) if source else None)
    if teacher is not None:
        check_teacher(teacher, tokenizer, task.labels)

    torch.manual_seed(cfg.seed)
    model = fam.build(model_cfg, kernels=cfg.kernels).to(cfg.device)
    say(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary of "
        f"{tokenizer.vocab_size:,} {tokenizer.kind} tokens")
    run = Run(cfg, model_cfg, Path(cfg.out), ranks, tokenizer, task, labels, model,
              make_optimizer(model, cfg), model, torch.Generator().manual_seed(cfg.seed),
              lambda: autocast(cfg.device, cfg.dtype), grad_scaler(cfg.device, cfg.dtype),
              replacing=replacing)
    if cfg.init_from is not None and not resume:
        loaded, _ = checkpoint.load(cfg.init_from, kernels=cfg.kernels, device=cfg.device)
        # A classifier's head starts fresh (as the model initialised it), whatever the source's.
        checkpoint.init_from(model, loaded, fresh=("classifier.",) if labels else ())
    if resume:
        _restore(run)
    if ranks.is_main and run.step < cfg.max_iters and (warning := warmup_warning(cfg)):
        print(warning, file=sys.stderr)
    if ranks.world > 1:  # each rank its own dropout masks
        torch.manual_seed(cfg.seed + 1_000_003 * ranks.rank + run.step)
    model.train()
    forward = ranks.wrap(model if teacher is None
                         else Distillation(model, teacher.model, fam, cfg))
    run.forward = torch.compile(forward) if cfg.compile else forward
    return run


def _restore(run: Run) -> None:
    """Brings back the run in run.out: weights, optimizer, step, tokens and RNG states."""
    cfg = run.cfg
    loaded, _ = checkpoint.load(run.out, kernels=cfg.kernels, device=cfg.device)
    run.model.load_state_dict(loaded.state_dict())
    state = checkpoint.load_train_state(  # older runs: separate W_Q, W_K, W_V
        run.out, run.optimizer,
        adapt=lambda saved: stack_fused_states(run.model, run.optimizer, saved))
    run.step = run.saved = state["step"]
    # States saved before token counts were kept are GPT runs, whose steps are all alike.
    run.tokens_seen = state.get("tokens", run.step * cfg.batch_size * cfg.grad_accum
                                * run.ranks.world * run.model_cfg.block_size)
    run.data_gen.set_state(state["data_rng"])
    if run.scaler is not None and "grad_scale" in state:  # float16's; a scale of 2^16 else
        run.scaler.load_state_dict({**run.scaler.state_dict(), "scale": state["grad_scale"],
                                    "_growth_tracker": state["grad_scale_growth"]})
    torch.set_rng_state(state["torch_rng"])
    if run.ranks.is_main:
        truncate_metrics(run.out, run.step)
