"""One optimizer step, as pygpt.train runs it and the benchmarks time it."""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, NamedTuple, Optional, Sequence

import torch
from torch import nn


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: Sequence[NamedTuple], lr: float, grad_clip: float, *,
               forward: Optional[Callable[..., object]] = None,
               no_sync: Optional[Callable[[bool], ContextManager]] = None) -> float:
    """Sets the learning rate, runs forward and backward over the micro-batches (gradients
    accumulate their mean loss), clips the global gradient norm to grad_clip (0: off), steps and
    clears the gradients. Returns the step's loss.

    A micro-batch is a NamedTuple of the forward's keyword arguments (a task's batch).
    forward: what computes the loss, `forward(**batch).loss` (default the model; pass its
    torch.compile'd or DistributedDataParallel wrapper). no_sync(skip): a context in which
    backward does not all-reduce, entered with skip=True for all but the last micro-batch."""
    forward = model if forward is None else forward
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with no_sync(not last) if no_sync is not None else contextlib.nullcontext():
            loss = forward(**batch._asdict()).loss / len(micro_batches)
            loss.backward()
        total += loss.item()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
