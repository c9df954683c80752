"""Structured pruning made physical: which heads and MLP hidden units to keep (the highest
scores of pygpt.pruning.importance), and the smaller model that holds only them, a normal
model of the family on dense kernels.

Every layer keeps the same number of heads and of MLP units (a fraction is applied per layer),
so the config says the new sizes with n_head and mlp_dim; each head keeps its width (qk_dim
and v_dim say it once n_head no longer divides n_embd into it). Removing head h takes rows
h of W_Q, W_K and W_V (with their biases) and the columns of W_O that read its values;
removing a hidden unit takes its row of the MLP's widening (and bias) and its column of the
projection back. Kept heads and units stay in their order, so keeping all of them gives the
model as it was, bit for bit."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from pygpt.config import ModelConfig
from pygpt.families import build
from pygpt.positions import encoding
from pygpt.pruning.importance import Scores, units_of

Keep = dict[str, torch.Tensor]  # module name -> the indices (ascending) of the heads/units kept


def kept(scores: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the `count` highest scores, ascending (ties: the lower index stays)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return torch.tensor(sorted(order[:count]), dtype=torch.long)


def removed_count(total: int, fraction: float) -> int:
    """How many of `total` heads or units a fraction removes (rounded to the nearest)."""
    return int(round(fraction * total))


def check_prunable(cfg: ModelConfig, heads: int, mlp_width: int) -> None:
    """ValueError (one line) unless the model can keep `heads` heads and `mlp_width` MLP
    units per layer."""
    if not 1 <= heads <= cfg.n_head:
        raise ValueError(f"the heads kept per layer must be 1 to n_head {cfg.n_head}, got {heads}")
    if heads < cfg.n_head:
        if not cfg.attn_proj:
            raise ValueError("heads cannot be pruned without attn_proj: the heads' "
                             "concatenation is the layer's output")
        if encoding(cfg.pos_encoding).score_bias is not None:
            raise ValueError(f"heads cannot be pruned with pos_encoding {cfg.pos_encoding}: its "
                             "per-head score bias is shared by every layer's heads")
    if mlp_width != cfg.mlp_width and not cfg.mlp:
        raise ValueError("the model has no MLP (mlp off) to prune")
    if not 1 <= mlp_width <= cfg.mlp_width:
        raise ValueError(f"the MLP units kept per layer must be 1 to {cfg.mlp_width}, got "
                         f"{mlp_width}")


def choose(model: nn.Module, scores: Scores, heads: int, mlp_width: int) -> Keep:
    """The heads (`heads` per layer) and MLP units (`mlp_width` per MLP) to keep: the highest
    scores of each layer."""
    cfg: ModelConfig = model.config
    check_prunable(cfg, heads, mlp_width)
    units = units_of(model)
    keep = {name: kept(scores[name], heads) for name in units.attention if name in scores}
    keep.update({name: kept(scores[name], mlp_width) for name in units.mlps})
    return keep


def pruned_config(cfg: ModelConfig, heads: int, mlp_width: int) -> ModelConfig:
    """cfg with `heads` heads of the same widths and `mlp_width` MLP units per layer; cfg
    itself when nothing is removed."""
    changes: dict[str, int] = {}
    if heads != cfg.n_head:
        changes.update(n_head=heads, qk_dim=cfg.qk_head_dim, v_dim=cfg.v_head_dim)
    if cfg.mlp and mlp_width != cfg.mlp_width:
        changes["mlp_dim"] = mlp_width
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _head_rows(heads: torch.Tensor, width: int, offset: int = 0) -> torch.Tensor:
    """The rows (or columns) of the heads' `width`-wide slices, after `offset` others."""
    return (offset + heads[:, None] * width + torch.arange(width)).flatten()


def _slice_attention(state: dict[str, torch.Tensor], name: str, n_head: int, qk: int, v: int,
                     heads: torch.Tensor) -> None:
    q_rows, v_rows = _head_rows(heads, qk), _head_rows(heads, v)
    inner = n_head * qk
    fused = {f"{name}.qkv": torch.cat([q_rows, _head_rows(heads, qk, inner),
                                       _head_rows(heads, v, 2 * inner)]),
             f"{name}.q": q_rows, f"{name}.kv": torch.cat([q_rows, _head_rows(heads, v, inner)])}
    for prefix, rows in fused.items():
        for suffix in (".weight", ".bias"):
            if prefix + suffix in state:
                state[prefix + suffix] = state[prefix + suffix][rows]
    state[f"{name}.proj.weight"] = state[f"{name}.proj.weight"][:, v_rows]


def _slice_mlp(state: dict[str, torch.Tensor], name: str, units: torch.Tensor) -> None:
    state[f"{name}.fc.weight"] = state[f"{name}.fc.weight"][units]
    if f"{name}.fc.bias" in state:
        state[f"{name}.fc.bias"] = state[f"{name}.fc.bias"][units]
    state[f"{name}.proj.weight"] = state[f"{name}.proj.weight"][:, units]


def shrink(model: nn.Module, keep: Keep, kernels: Optional[str] = None) -> nn.Module:
    """A new model of model's family holding only the heads and units in keep (choose's; the
    same number in every layer), in eval mode; model is not changed."""
    cfg: ModelConfig = model.config
    units = units_of(model)
    heads = {len(keep[n]) for n in units.attention if n in keep} or {cfg.n_head}
    widths = {len(keep[n]) for n in units.mlps} or {cfg.mlp_width}
    if len(heads) > 1 or len(widths) > 1:
        raise ValueError("every layer must keep as many heads and MLP units as the others")
    new_cfg = pruned_config(cfg, heads.pop(), widths.pop())
    state = {k: t.clone() for k, t in model.state_dict().items()}
    for name, attn in units.attention.items():
        if name in keep and len(keep[name]) != attn.n_head:
            _slice_attention(state, name, attn.n_head, cfg.qk_head_dim, cfg.v_head_dim,
                             keep[name])
    for name, mlp in units.mlps.items():
        if len(keep[name]) != mlp.fc.out_features:
            _slice_mlp(state, name, keep[name])
    pruned = build(new_cfg, kernels=kernels or getattr(model, "kernels", "ext"))
    if hasattr(model, "label_smoothing"):
        pruned.label_smoothing = model.label_smoothing
    pruned.load_state_dict(state)
    return pruned.eval()
