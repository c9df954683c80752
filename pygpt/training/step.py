"""One optimizer step, as pygpt.train runs it and the benchmarks time it, with the divergence
guard: a step whose loss or gradient norm is not finite (nan or inf) raises Diverged before the
optimizer touches the weights, so a diverged run never turns finite weights into garbage. With
float16's loss scaler, a gradient that overflowed is the scaler's business instead: the step is
skipped and the scale lowered, as torch.amp.GradScaler does."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager, NamedTuple, Optional, Sequence

import torch
from torch import nn


class Diverged(ValueError):
    """Training produced a non-finite loss, gradient norm or weights."""


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: Sequence[NamedTuple], lr: float, grad_clip: float, *,
               forward: Optional[Callable[..., object]] = None,
               no_sync: Optional[Callable[[bool], ContextManager]] = None,
               inputs: Callable[[Any], dict[str, Any]] = lambda batch: batch._asdict(),
               autocast: Callable[[], ContextManager] = contextlib.nullcontext,
               scaler: Optional[torch.amp.GradScaler] = None) -> float:
    """Sets the learning rate, runs forward and backward over the micro-batches (gradients
    accumulate their mean loss), clips the global gradient norm to grad_clip (0: off), steps and
    clears the gradients. Returns the step's loss; raises Diverged (the weights and optimizer
    state untouched, the gradients cleared) if the loss or the gradient norm is not finite.

    A micro-batch is a task's batch; inputs(batch) gives the forward's keyword arguments
    (default: a NamedTuple's fields; pass the task's Task.inputs).
    forward: what computes the loss, `forward(**batch).loss` (default the model; pass its
    torch.compile'd or DistributedDataParallel wrapper). no_sync(skip): a context in which
    backward does not all-reduce, entered with skip=True for all but the last micro-batch.
    autocast(): the context the forwards run in (pygpt.mixed_precision); scaler: float16's loss
    scaler, or None."""
    forward = model if forward is None else forward
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with no_sync(not last) if no_sync is not None else contextlib.nullcontext():
            with autocast():
                loss = forward(**inputs(batch)).loss / len(micro_batches)
            (loss if scaler is None else scaler.scale(loss)).backward()
        total += loss.item()
    if scaler is not None:
        scaler.unscale_(optimizer)
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()
                                              if p.grad is not None])
    overflowed = scaler is not None and math.isfinite(total) and not math.isfinite(norm.item())
    if not (math.isfinite(total) and math.isfinite(norm.item())) and not overflowed:
        optimizer.zero_grad(set_to_none=True)
        raise Diverged(f"the loss is {total:.4g} and the gradient norm {norm.item():.4g}")
    if scaler is None:
        optimizer.step()
    else:  # skips the step if the unscaled gradients hold an inf or nan
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


def check_finite_weights(model: nn.Module) -> None:
    """Raises Diverged naming the first parameter that holds a nan or inf (the optimizer can
    step finite gradients into non-finite weights, e.g. with a huge learning rate)."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise Diverged(f"the weights of {bad[0]}{more} are not finite")
