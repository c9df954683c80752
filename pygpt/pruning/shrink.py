"""Structured pruning made physical: which heads and MLP hidden units to keep (the highest
scores of pygpt.pruning.importance), and the smaller model that holds only them, a normal
model of the family on dense kernels.

Either every layer keeps the same number (choose: the highest scores of each layer), or one
ranking over all layers removes the lowest scores wherever they are (choose_globally, Michel et
al.'s global pruning: the scores are normalised per layer, so layers compare), every layer
keeping at least one head and one MLP unit. The config then says the new sizes: n_head and
mlp_dim where every layer has the same, layer_heads and layer_mlp_dims where they differ; each
head keeps its width (qk_dim and v_dim say it once n_head no longer divides n_embd into it).
Removing head h takes rows h of W_Q, W_K and W_V (with their biases) and the columns of W_O
that read its values; removing a hidden unit takes its row of the MLP's widening (and bias) and
its column of the projection back. Kept heads and units stay in their order, so keeping all of
them gives the model as it was, bit for bit."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from pygpt.config import ModelConfig
from pygpt.config.fields import applies
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


def _check_heads_removable(cfg: ModelConfig) -> None:
    if not cfg.attn_proj:
        raise ValueError("heads cannot be pruned without attn_proj: the heads' concatenation is "
                         "the layer's output")
    if encoding(cfg.pos_encoding).score_bias is not None:
        raise ValueError(f"heads cannot be pruned with pos_encoding {cfg.pos_encoding}: its "
                         "per-head score bias is shared by every layer's heads")


def check_prunable(cfg: ModelConfig, heads: int, mlp_width: int) -> None:
    """ValueError (one line) unless the model can keep `heads` heads and `mlp_width` MLP
    units per layer."""
    fewest_heads = min(cfg.heads(i) for i in range(cfg.n_layer))
    fewest_units = min(cfg.mlp_width_of(i) for i in range(cfg.n_layer))
    if not 1 <= heads <= fewest_heads:
        most = f"{fewest_heads}, the fewest of a layer" if cfg.layer_heads else f"n_head {cfg.n_head}"
        raise ValueError(f"the heads kept per layer must be 1 to {most}, got {heads}")
    if heads < cfg.n_head:
        _check_heads_removable(cfg)
    if mlp_width != cfg.mlp_width and not cfg.mlp:
        raise ValueError("the model has no MLP (mlp off) to prune")
    if not 1 <= mlp_width <= fewest_units:
        most = f"{fewest_units}, the fewest of a layer" if cfg.layer_mlp_dims else fewest_units
        raise ValueError(f"the MLP units kept per layer must be 1 to {most}, got {mlp_width}")


def choose(model: nn.Module, scores: Scores, heads: int, mlp_width: int) -> Keep:
    """The heads (`heads` per layer) and MLP units (`mlp_width` per MLP) to keep: the highest
    scores of each layer."""
    cfg: ModelConfig = model.config
    check_prunable(cfg, heads, mlp_width)
    units = units_of(model)
    keep = {name: kept(scores[name], heads) for name in units.attention if name in scores}
    keep.update({name: kept(scores[name], mlp_width) for name in units.mlps})
    return keep


def ranked_globally(scores: Scores, removed: int) -> Keep:
    """The indices (ascending) each layer keeps when the `removed` lowest scores of all layers
    (scores: layer name -> one score per head or unit, in layer order) go, every layer keeping
    at least one. Ties go in a fixed order: the later layer's, then the higher index, first (so
    that within a layer the kept are those kept() keeps)."""
    left = {name: len(s) for name, s in scores.items()}
    order = sorted((float(s[i]), -layer, -i, name) for layer, (name, s) in enumerate(scores.items())
                   for i in range(len(s)))
    gone: dict[str, set[int]] = {name: set() for name in scores}
    for _, _, minus_i, name in order:
        if removed == 0:
            break
        if left[name] > 1:
            gone[name].add(-minus_i)
            left[name] -= 1
            removed -= 1
    return {name: torch.tensor([i for i in range(len(s)) if i not in gone[name]],
                               dtype=torch.long) for name, s in scores.items()}


def check_globally_prunable(cfg: ModelConfig, head_fraction: float, mlp_fraction: float) -> None:
    """ValueError (one line) unless choose_globally can prune cfg's model so."""
    if not applies(ModelConfig, "layer_heads", cfg.arch):
        raise ValueError(f"a {cfg.arch} model's layers keep the same number of heads and MLP "
                         "units (its config holds no per-layer sizes): rank per layer")
    if removed_count(sum(cfg.heads(i) for i in range(cfg.n_layer)), head_fraction):
        _check_heads_removable(cfg)
    if mlp_fraction > 0 and not cfg.mlp:
        raise ValueError("the model has no MLP (mlp off) to prune")


def choose_globally(model: nn.Module, scores: Scores, head_fraction: float,
                    mlp_fraction: float) -> Keep:
    """The heads and MLP units to keep when head_fraction of all the model's heads and
    mlp_fraction of all its MLP units go: the lowest scores of one ranking over every layer
    (ranked_globally), each layer keeping at least one of each. Only for a family whose config
    holds per-layer sizes (layer_heads' tag: GPT and BERT; a translator's uses choose)."""
    cfg: ModelConfig = model.config
    check_globally_prunable(cfg, head_fraction, mlp_fraction)
    units = units_of(model)
    heads = {name: scores[name] for name in units.attention if name in scores}
    mlps = {name: scores[name] for name in units.mlps}
    keep = ranked_globally(heads, removed_count(sum(map(len, heads.values())), head_fraction))
    return {**keep, **ranked_globally(mlps, removed_count(sum(map(len, mlps.values())),
                                                          mlp_fraction))}


def pruned_config(cfg: ModelConfig, heads: list[int], mlp_widths: list[int]) -> ModelConfig:
    """cfg with heads[i] heads (of the same widths) and mlp_widths[i] MLP units in the i-th
    layer (n_head and mlp_dim where the layers agree, layer_heads and layer_mlp_dims where they
    differ); cfg itself when nothing is removed."""
    changes: dict[str, object] = {}
    if heads != [cfg.heads(i) for i in range(len(heads))]:
        changes.update(n_head=max(heads), qk_dim=cfg.qk_head_dim, v_dim=cfg.v_head_dim,
                       layer_heads=() if len(set(heads)) == 1 else tuple(heads))
    if cfg.mlp and mlp_widths != [cfg.mlp_width_of(i) for i in range(len(mlp_widths))]:
        uniform = len(set(mlp_widths)) == 1
        changes.update(mlp_dim=mlp_widths[0] if uniform else cfg.mlp_dim,
                       layer_mlp_dims=() if uniform else tuple(mlp_widths))
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
    """A new model of model's family holding only the heads and units in keep (choose's or
    choose_globally's), in eval mode; model is not changed."""
    cfg: ModelConfig = model.config
    units = units_of(model)
    heads = [len(keep[n]) if n in keep else m.n_head for n, m in units.attention.items()]
    widths = [len(keep[n]) for n in units.mlps]
    if not applies(ModelConfig, "layer_heads", cfg.arch) and (len(set(heads)) > 1
                                                              or len(set(widths)) > 1):
        raise ValueError(f"every layer of a {cfg.arch} model must keep as many heads and MLP "
                         "units as the others (its config holds no per-layer sizes)")
    new_cfg = pruned_config(cfg, heads, widths)
    state = {k: t.clone() for k, t in model.state_dict().items()}
    for name, attn in units.attention.items():
        if name in keep and len(keep[name]) != attn.n_head:
            _slice_attention(state, name, attn.n_head, cfg.qk_head_dim, cfg.v_head_dim,
                             keep[name])
    for name, mlp in units.mlps.items():
        if len(keep[name]) != mlp.fc.out_features:
            _slice_mlp(state, name, keep[name])
    pruned = build(new_cfg, kernels=kernels or getattr(model, "kernels", "ext"))
    pruned.load_state_dict(state)
    return pruned.eval()
