"""How much a model needs each of its attention heads and MLP hidden units, measured on data.

A head's importance is Michel et al.'s (2019, "Are Sixteen Heads Really Better than One?"): a
mask variable xi_h multiplies the head's output (its attention-weighted values, before W_O),
and the score is the expected absolute gradient of the loss with respect to xi_h at xi = 1,
E |dL / dxi_h|, here the mean over batches of each batch's |gradient|. It is the first-order
(Taylor) estimate of how much the loss changes when the head is removed. An MLP hidden unit's
is the same with a mask on its activation (the input of the MLP's output projection). Scores
are normalised per layer by their L2 norm, as the paper does, so that layers compare.

The masks are forward pre-hooks on the output projections of the model itself, on whatever
kernel set it runs: at xi = 1 they multiply by one, so the loss (and so the gradients) are
those of the model's own outputs, bit for bit. The same masks with zeros in them compute the
model with those heads or units removed (what the tests compare a pruned model against)."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator, NamedTuple, Optional

import torch
from torch import nn

from pygpt.nn import MLP, MultiHeadAttention

Scores = dict[str, torch.Tensor]  # module name -> one score per head (attention) or unit (MLP)


class Units(NamedTuple):
    """What the model holds to prune: its attention layers and MLPs, by module name."""

    attention: dict[str, MultiHeadAttention]
    mlps: dict[str, MLP]


def units_of(model: nn.Module) -> Units:
    modules = list(model.named_modules())
    return Units({n: m for n, m in modules if isinstance(m, MultiHeadAttention)},
                 {n: m for n, m in modules if isinstance(m, MLP)})


def ones_masks(model: nn.Module) -> Scores:
    """A mask of ones per head of each attention layer (with W_O) and per MLP hidden unit."""
    units = units_of(model)
    masks = {n: torch.ones(m.n_head) for n, m in units.attention.items() if m.proj is not None}
    masks.update({n: torch.ones(m.fc.out_features) for n, m in units.mlps.items()})
    return masks


def _head_hook(n_head: int, mask: torch.Tensor) -> Callable:
    def hook(_: nn.Module, args: tuple) -> tuple:
        y = args[0]  # (..., n_head * v_width): the heads' outputs side by side
        heads = y.unflatten(-1, (n_head, -1)) * mask.to(y.dtype).unsqueeze(-1)
        return (heads.flatten(-2), *args[1:])
    return hook


def _unit_hook(mask: torch.Tensor) -> Callable:
    def hook(_: nn.Module, args: tuple) -> tuple:
        return (args[0] * mask.to(args[0].dtype), *args[1:])
    return hook


@contextlib.contextmanager
def masked(model: nn.Module, masks: Scores) -> Iterator[None]:
    """Inside, model's heads and MLP units are multiplied by masks (module name -> a mask per
    head or unit; ones_masks' names); a module without an entry is left alone."""
    units = units_of(model)
    handles = []
    try:
        for name, mask in masks.items():
            if name in units.attention:
                attn = units.attention[name]
                if attn.proj is None:
                    raise ValueError(f"{name} has no output projection (attn_proj off): its "
                                     "heads cannot be masked or pruned")
                handles.append(attn.proj.register_forward_pre_hook(_head_hook(attn.n_head, mask)))
            elif name in units.mlps:
                handles.append(units.mlps[name].proj.register_forward_pre_hook(_unit_hook(mask)))
            else:
                raise ValueError(f"the model has no attention layer or MLP named {name!r}")
        yield
    finally:
        for handle in handles:
            handle.remove()


def normalised(scores: torch.Tensor) -> torch.Tensor:
    """One layer's scores divided by their L2 norm (Michel et al.'s per-layer normalisation);
    all zeros stay zeros."""
    norm = scores.norm()
    return scores / norm if norm > 0 else scores


def importance(model: nn.Module, batches: Iterable[NamedTuple],
               device: Optional[str] = None) -> Scores:
    """Each head's and MLP unit's score (module docstring) over batches (a task's NamedTuples
    of forward arguments, whose output has a .loss), per layer normalised. The model runs in
    eval mode (no dropout: the same batches give the same scores); its weights get no
    gradient, and it is left as it was."""
    masks = {n: m.requires_grad_() for n, m in ones_masks(model).items()}
    totals = {n: torch.zeros_like(m) for n, m in masks.items()}
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval().requires_grad_(False)
    count = 0
    try:
        with masked(model, masks):
            for batch in batches:
                if device is not None:
                    batch = type(batch)(*(t.to(device) for t in batch))
                loss = model(**batch._asdict()).loss
                grads = torch.autograd.grad(loss, list(masks.values()))
                for name, grad in zip(masks, grads):
                    totals[name] += grad.abs()
                count += 1
    finally:
        model.train(was_training)
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    if count == 0:
        raise ValueError("importance needs at least one batch")
    return {name: normalised(total / count) for name, total in totals.items()}
