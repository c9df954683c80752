"""The training loop and its evaluation.

Batches from the task (pygpt.tasks: random context windows of the 90/10 split for a
GPT, sentence pairs by token budget for a translator), the optimizer and schedule of
pygpt.training.optim, gradient accumulation and clipping (pygpt.training.step); every
eval_interval steps the mean loss over fixed batches of both splits is logged (metrics.jsonl) and
the checkpoint saved. Resuming continues a run exactly: weights, optimizer, step, and the RNG
states of data order and dropout all come back, so a run stopped after N steps and resumed for M
more ends with the weights of N + M straight. (The schedule ends at lr_decay_iters, by default
max_iters: resuming with a larger max_iters stretches the remaining schedule.) Ctrl-C or SIGTERM
stops at the end of the current step and saves, ready for --resume (pygpt.training.stop). A
non-finite loss, gradient norm, weights or evaluation loss stops the run with Diverged before
anything is saved (pygpt.training.step): the last checkpoint stays as it was.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from pygpt.storage import checkpoint
from pygpt.storage.compat import stack_fused_states
from pygpt.config import ModelConfig, TrainConfig
from pygpt.families import Family, family
from pygpt.plot import plot_runs
from pygpt.storage.run_files import LOSS_PLOT, METRICS
from pygpt.tokenizer import BPETokenizer, CharTokenizer, Tokenizer, WordPieceTokenizer
from pygpt.training.distill import Distillation, check_teacher, load_teacher
from pygpt.training.distributed import Distributed
from pygpt.training.metrics_log import append_metrics, truncate_metrics
from pygpt.training.optim import lr_at, make_optimizer, warmup_warning
from pygpt.training.progress import Progress
from pygpt.training.step import Diverged, check_finite_weights, train_step
from pygpt.training.stop import StopRequest
from pygpt.tasks import Task


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, cfg: TrainConfig,
             batch_size: Optional[int] = None, model_metrics: bool = True) -> dict[str, Any]:
    """The task's metrics per split ("train_loss", "val_loss", ...) over the same batches every
    time: eval_iters drawn with their own generator (so evaluating never changes the training
    data order), or the fixed pass a task may give instead (see Task.eval_batches). With
    model_metrics, the task's figures that run the model are added (a translator's validation
    BLEU, and val_samples, which are not numbers); model is the bare model, not a DDP wrapper."""
    model.eval()
    result = {}
    for i, split in enumerate(("train", "val")):
        gen = torch.Generator().manual_seed(cfg.seed + 1 + i)
        sums: dict[str, list[float]] = {}
        for batch in task.eval_batches(split, batch_size or cfg.batch_size, gen, cfg.eval_iters):
            batch = type(batch)(*(t.to(cfg.device) for t in batch))
            for name, (value, count) in task.metrics(model(**task.inputs(batch)), batch).items():
                total = sums.setdefault(name, [0.0, 0.0])
                total[0] += value
                total[1] += count
        means = {name: value / count if count else math.nan
                 for name, (value, count) in sums.items()}
        try:
            summary = task.summarise(means)
        except OverflowError:  # exp of a huge loss (perplexity): the weights are garbage
            raise Diverged(f"the evaluation's {split} loss is {means.get('loss')}") from None
        result.update({f"{split}_{name}": v for name, v in summary.items()})
    if model_metrics:
        result.update(task.model_metrics(model))
    model.train()
    return result


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


def default_threads() -> int:
    """Half the CPUs this process may run on, at least 1: torch's own default (every core) spins
    its threads at each barrier and collapses as soon as another busy process shares the cores
    (100 baby steps beside a busy loop on a shared 2-core machine: 497-739 s at 2 threads,
    25-102 s at 1)."""
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    return max(1, cpus // 2)


def train(model_cfg: ModelConfig, cfg: TrainConfig, *, resume: bool = False,
          progress: bool = True, stop: Optional[StopRequest] = None,
          replacing: Sequence[str] = ()) -> dict[str, Any]:
    """Runs (or with resume, continues) a training run into cfg.out; returns the last metrics.

    stop: the StopRequest the loop watches (its signum then tells which signal stopped the run).
    replacing: the files of an earlier run in cfg.out that the run's first save removes, in its
    commit (pygpt.train --overwrite): a run that fails or stops before it leaves them whole.
    Raises Diverged if training diverges."""
    torch.set_num_threads(cfg.threads if cfg.threads is not None else default_threads())
    out = Path(cfg.out)
    ranks = Distributed(cfg.device)
    fam = family(model_cfg.arch)
    teacher = load_teacher(cfg, model_cfg) if cfg.distill_from is not None else None
    # Rank 0 learns the tokenizer and writes the token cache; the others take both from it.
    tokenizer = ranks.share_tokenizer(make_tokenizer(fam, model_cfg, cfg, resume)
                                      if ranks.is_main else None)
    cfg = dataclasses.replace(cfg, tokenizer=tokenizer.kind)  # what the run really uses
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    task = fam.make_task(model_cfg, cfg, tokenizer, ranks,
                         checkpoint.load_labels(cfg.out) if resume else None)
    labels = task.labels  # a classifier's, saved with each checkpoint
    if labels is not None:  # the head's classes come from the labels, as the vocabulary
        model_cfg = dataclasses.replace(model_cfg, num_labels=len(labels))
    elif model_cfg.num_labels:  # pretraining a classifier further keeps its labels
        if not resume and cfg.init_from is None:
            raise ValueError(f"num_labels {model_cfg.num_labels} without labels: --task "
                             "classify sets it from the data's labels, and pretraining keeps "
                             "the labels of an --init-from or --resume classifier")
        labels = checkpoint.load_labels(cfg.out if resume else cfg.init_from)
    if teacher is not None:
        check_teacher(teacher, tokenizer, task.labels)

    torch.manual_seed(cfg.seed)
    model = fam.build(model_cfg, kernels=cfg.kernels).to(cfg.device)
    optimizer = make_optimizer(model, cfg)
    data_gen = torch.Generator().manual_seed(cfg.seed)
    step = tokens_seen = 0
    if cfg.init_from is not None and not resume:
        source, _ = checkpoint.load(cfg.init_from, kernels=cfg.kernels, device=cfg.device)
        # A classifier's head starts fresh (as the model initialised it), whatever the source's.
        checkpoint.init_from(model, source, fresh=("classifier.",) if labels else ())
    if resume:
        loaded, _ = checkpoint.load(out, kernels=cfg.kernels, device=cfg.device)
        model.load_state_dict(loaded.state_dict())
        state = checkpoint.load_train_state(  # older runs: separate W_Q, W_K, W_V
            out, optimizer, adapt=lambda saved: stack_fused_states(model, optimizer, saved))
        step = state["step"]
        # States saved before token counts were kept are GPT runs, whose steps are all alike.
        tokens_seen = state.get("tokens", step * cfg.batch_size * cfg.grad_accum * ranks.world
                                * model_cfg.block_size)
        data_gen.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        if ranks.is_main:
            truncate_metrics(out, step)
    if ranks.is_main and step < cfg.max_iters and (warning := warmup_warning(cfg)):
        print(warning, file=sys.stderr)
    if ranks.world > 1:  # each rank its own dropout masks
        torch.manual_seed(cfg.seed + 1_000_003 * ranks.rank + step)
    model.train()
    forward = ranks.wrap(model if teacher is None
                         else Distillation(model, teacher.model, fam, cfg))
    forward = torch.compile(forward) if cfg.compile else forward

    saved = step if resume else None  # the step of the checkpoint in out

    def save(record: dict[str, Any]) -> None:
        """Saves the checkpoint, unless the weights or the evaluation's losses (finite weights
        can still be garbage: huge) are not finite."""
        nonlocal saved
        check_finite_weights(model)
        for name in ("train_loss", "val_loss"):
            if not math.isfinite(record[name]):
                raise Diverged(f"the evaluation's {name} is {record[name]}")
        state = {"optimizer": optimizer.state_dict(), "data_rng": data_gen.get_state(),
                 "torch_rng": torch.get_rng_state(), "tokens": tokens_seen}
        checkpoint.save(out, model, tokenizer, cfg, state, step=step, labels=labels,
                        remove=replacing if saved is None else ())
        saved = step

    def micro_batches() -> list:
        # Every rank draws the same global batch and trains on its own slice of it, so N ranks
        # of batch B step exactly like one process of batch N * B. A token-budget batch is not
        # cut by rows: each rank draws N and trains on its own (N ranks step as one process
        # of --grad-accum N times as large).
        if task.by_tokens:
            draws = [[task.batch("train", 0, data_gen) for _ in range(ranks.world)][ranks.rank]
                     for _ in range(cfg.grad_accum)]
            return [type(b)(*(t.to(cfg.device) for t in b)) for b in draws]
        mine = slice(ranks.rank * cfg.batch_size, (ranks.rank + 1) * cfg.batch_size)
        batches = [task.batch("train", cfg.batch_size * ranks.world, data_gen)
                   for _ in range(cfg.grad_accum)]
        return [type(b)(*(t[mine].to(cfg.device) for t in b)) for b in batches]

    last: dict[str, Any] = {"step": step, "tokens": tokens_seen}
    tokens = 0  # since the last evaluation
    train_time, t_start = 0.0, time.perf_counter()
    bar = Progress(cfg.max_iters, step, progress and ranks.is_main)
    stop = stop if stop is not None else StopRequest()
    taking = step + 1
    try:
        with stop:
            while step < cfg.max_iters and not stop.requested:
                t0, taking = time.perf_counter(), step + 1  # the step under way
                lr = lr_at(step, cfg)
                batches = micro_batches()
                loss = train_step(model, optimizer, batches, lr, cfg.grad_clip, forward=forward,
                                  inputs=task.inputs,
                                  no_sync=lambda skip: ranks.no_sync(forward, skip))
                step += 1
                step_tokens = sum(task.tokens(b) for b in batches) * ranks.world
                tokens += step_tokens
                dt = time.perf_counter() - t0
                train_time += dt
                bar.update(loss, step_tokens / dt)
                if step % cfg.eval_interval == 0 or step == cfg.max_iters or stop.requested:
                    tokens_seen += tokens
                    last = {"step": step, "tokens": tokens_seen, "lr": lr,
                            **evaluate(model, task, cfg, batch_size=cfg.batch_size * ranks.world,
                                       model_metrics=ranks.is_main),
                            "tokens_per_s": tokens / max(train_time, 1e-9),
                            "elapsed_s": time.perf_counter() - t_start}
                    train_time, tokens = 0.0, 0
                    samples = last.pop("val_samples", [])  # metrics.jsonl holds numbers only
                    if not ranks.is_main:
                        continue
                    save(last)
                    append_metrics(out, last)
                    bar.write(f"step {step}: {task.describe(last)}, "
                              f"{last['tokens_per_s']:,.0f} tokens/s")
                    for sample in samples if progress else ():  # each text cut to 100
                        bar.write("  " + " | ".join(f"{k}: {v[:99] + '…' if len(v) > 100 else v}"
                                                    for k, v in sample.items()))
    except Diverged as e:
        bar.close()
        kept = (f"the checkpoint of step {saved} in {out} is unchanged" if saved is not None
                else "nothing was saved")
        raise Diverged(f"training diverged at step {taking}: {e}; {kept}. Try a lower --lr "
                       f"(now {cfg.lr:g}) or a longer --warmup-iters") from None
    bar.close()
    ranks.stop()
    if ranks.is_main and saved is not None and (out / METRICS).exists():  # not an earlier run's
        try:
            plot_runs([out], out / LOSS_PLOT)
        except (OSError, ValueError) as e:  # a picture is not worth failing a finished run
            print(f"warning: could not draw {out / LOSS_PLOT}: {e}", file=sys.stderr)
    if stop.requested:
        print(f"stopped at step {step}; " + (f"continue with --resume --out {out}"
                                              if saved is not None else "nothing was saved"),
              file=sys.stderr)
    return last
