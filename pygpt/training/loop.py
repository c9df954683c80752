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

import math
import sys
import time
from typing import Any, Optional, Sequence

import torch

from pygpt.config import ModelConfig, TrainConfig
from pygpt.mixed_precision import autocast
from pygpt.plot import plot_runs
from pygpt.storage import checkpoint
from pygpt.storage.run_files import LOSS_PLOT, METRICS
from pygpt.tasks import Task
from pygpt.training.metrics_log import append_metrics
from pygpt.training.optim import lr_at
from pygpt.training.prepare import Run, prepare
from pygpt.training.progress import Progress
from pygpt.training.step import Diverged, check_finite_weights, train_step
from pygpt.training.stop import StopRequest


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, cfg: TrainConfig,
             batch_size: Optional[int] = None, model_metrics: bool = True) -> dict[str, Any]:
    """The task's metrics per split ("train_loss", "val_loss", ...) over the same batches every
    time: eval_iters drawn with their own generator (so evaluating never changes the training
    data order), or the fixed pass a task may give instead (see Task.eval_batches). With
    model_metrics, the task's figures that run the model are added (a translator's validation
    BLEU, and val_samples, which are not numbers); model is the bare model, not a DDP wrapper.
    The model computes in the run's number type (cfg.dtype)."""
    with autocast(cfg.device, cfg.dtype):
        return _evaluate(model, task, cfg, batch_size, model_metrics)


def _evaluate(model: torch.nn.Module, task: Task, cfg: TrainConfig, batch_size: Optional[int],
              model_metrics: bool) -> dict[str, Any]:
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


def train(model_cfg: ModelConfig, cfg: TrainConfig, *, resume: bool = False,
          progress: bool = True, stop: Optional[StopRequest] = None,
          replacing: Sequence[str] = ()) -> dict[str, Any]:
    """Runs (or with resume, continues) a training run into cfg.out; returns the last metrics.

    stop: the StopRequest the loop watches (its signum then tells which signal stopped the run).
    replacing: the files of an earlier run in cfg.out that the run's first save removes, in its
    commit (pygpt.train --overwrite): a run that fails or stops before it leaves them whole.
    Raises Diverged if training diverges."""
    run = prepare(model_cfg, cfg, resume, replacing,
                  say=(lambda line: print(line, flush=True)) if progress else lambda line: None)
    bar = Progress(run.cfg.max_iters, run.step, progress and run.ranks.is_main)
    stop = stop if stop is not None else StopRequest()
    with stop:
        last = _steps(run, bar, stop, progress)
    bar.close()
    run.ranks.stop()
    out = run.out
    if run.ranks.is_main and run.saved is not None and (out / METRICS).exists():  # this run's
        try:
            plot_runs([out], out / LOSS_PLOT)
        except (OSError, ValueError) as e:  # a picture is not worth failing a finished run
            print(f"warning: could not draw {out / LOSS_PLOT}: {e}", file=sys.stderr)
    if stop.requested:
        print(f"stopped at step {run.step}; " + (f"continue with --resume --out {out}"
                                                  if run.saved is not None
                                                  else "nothing was saved"), file=sys.stderr)
    return last


def _steps(run: Run, bar: Progress, stop: StopRequest, progress: bool) -> dict[str, Any]:
    """Steps until max_iters or a stop, evaluating, saving and reporting every eval_interval
    steps (and at the last); returns the last evaluation's record (or where the run stands).
    Raises Diverged naming the step and what was kept."""
    cfg, task, ranks = run.cfg, run.task, run.ranks
    last: dict[str, Any] = {"step": run.step, "tokens": run.tokens_seen}
    tokens, train_time, t_start = 0, 0.0, time.perf_counter()  # tokens: since the last eval
    while run.step < cfg.max_iters and not stop.requested:
        t0, lr = time.perf_counter(), lr_at(run.step, cfg)
        batches = _micro_batches(run)
        try:
            loss = train_step(run.model, run.optimizer, batches, lr, cfg.grad_clip,
                              forward=run.forward, inputs=task.inputs,
                              no_sync=lambda skip: ranks.no_sync(run.forward, skip),
                              autocast=run.autocast, scaler=run.scaler)
        except Diverged as e:
            raise _diverged(run, run.step + 1, e, bar) from None
        run.step += 1
        step_tokens = sum(task.tokens(b) for b in batches) * ranks.world
        tokens += step_tokens
        dt = time.perf_counter() - t0
        train_time += dt
        bar.update(loss, step_tokens / dt)
        if run.step % cfg.eval_interval and run.step != cfg.max_iters and not stop.requested:
            continue
        run.tokens_seen += tokens
        try:
            last = {"step": run.step, "tokens": run.tokens_seen, "lr": lr,
                    **evaluate(run.model, task, cfg, batch_size=cfg.batch_size * ranks.world,
                               model_metrics=ranks.is_main),
                    "tokens_per_s": tokens / max(train_time, 1e-9),
                    "elapsed_s": time.perf_counter() - t_start}
            train_time, tokens = 0.0, 0
            samples = last.pop("val_samples", [])  # metrics.jsonl holds numbers only
            if ranks.is_main:
                _save(run, last)
        except Diverged as e:
            raise _diverged(run, run.step, e, bar) from None
        if not ranks.is_main:
            continue
        append_metrics(run.out, last)
        bar.write(f"step {run.step}: {task.describe(last)}, {last['tokens_per_s']:,.0f} tokens/s")
        for sample in samples if progress else ():  # each text cut to 100
            bar.write("  " + " | ".join(f"{k}: {v[:99] + '…' if len(v) > 100 else v}"
                                        for k, v in sample.items()))
    return last


def _diverged(run: Run, step: int, error: Diverged, bar: Progress) -> Diverged:
    """The Diverged a run ends with: the step, why, what was kept and what to try."""
    bar.close()
    kept = (f"the checkpoint of step {run.saved} in {run.out} is unchanged"
            if run.saved is not None else "nothing was saved")
    return Diverged(f"training diverged at step {step}: {error}; {kept}. Try a lower --lr "
                    f"(now {run.cfg.lr:g}) or a longer --warmup-iters")


def _micro_batches(run: Run) -> list:
    """This rank's micro-batches of one step. Every rank draws the same global batch and trains
    on its own slice of it, so N ranks of batch B step exactly like one process of batch N * B.
    A token-budget batch is not cut by rows: each rank draws N and trains on its own (N ranks
    step as one process of --grad-accum N times as large)."""
    cfg, task, ranks = run.cfg, run.task, run.ranks
    if task.by_tokens:
        draws = [[task.batch("train", 0, run.data_gen) for _ in range(ranks.world)][ranks.rank]
                 for _ in range(cfg.grad_accum)]
        return [type(b)(*(t.to(cfg.device) for t in b)) for b in draws]
    mine = slice(ranks.rank * cfg.batch_size, (ranks.rank + 1) * cfg.batch_size)
    batches = [task.batch("train", cfg.batch_size * ranks.world, run.data_gen)
               for _ in range(cfg.grad_accum)]
    return [type(b)(*(t[mine].to(cfg.device) for t in b)) for b in batches]


def _save(run: Run, record: dict[str, Any]) -> None:
    """Saves the checkpoint, unless the weights or the evaluation's losses (finite weights can
    still be garbage: huge) are not finite."""
    check_finite_weights(run.model)
    for name in ("train_loss", "val_loss"):
        if not math.isfinite(record[name]):
            raise Diverged(f"the evaluation's {name} is {record[name]}")
    state = {"optimizer": run.optimizer.state_dict(), "data_rng": run.data_gen.get_state(),
             "torch_rng": torch.get_rng_state(), "tokens": run.tokens_seen}
    if run.scaler is not None:  # float16's loss scale, where it has got to
        scaler = run.scaler.state_dict()
        state.update(grad_scale=scaler["scale"], grad_scale_growth=scaler["_growth_tracker"])
    checkpoint.save(run.out, run.model, run.tokenizer, run.cfg, state, step=run.step,
                    labels=run.labels, remove=run.replacing if run.saved is None else ())
    run.saved = run.step
