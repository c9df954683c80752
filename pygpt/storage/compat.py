"""Checkpoints of older layouts, read as today's: the one place that knows them. Each rewrite
takes what an older pygpt saved and returns it as the current model or optimizer expects; what
does not have an old shape comes back unchanged, for the loader to accept or refuse.

- Weights format 1 (before the models were assembled from pygpt.nn) named the GPT's embeddings
  `tok_emb`, `pos_emb`, `embed_norm` (LEGACY_NAMES).
- Format 2 kept the translator's label smoothing, a loss setting, among the model's settings;
  format 3 keeps it with the training settings, and saves only the model settings of the
  model's family (the others are at their defaults in older configs).
- Before the attention's input projections were fused (pygpt.nn.fused_linear), W_Q, W_K and W_V
  were separate `q`, `k`, `v` layers: their weights and biases are stacked into `qkv`
  (self-attention) or `kv` (cross-attention, whose `q` stays), and so are their AdamW moments.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pygpt.nn import MultiHeadAttention
from pygpt.nn.fused_linear import FusedLinear

TRAINING_SETTINGS = ("label_smoothing",)  # the model settings of format 2 that were training's


def upgrade_model(model: Any) -> Any:
    """A saved model config (dict) without the settings format 3 keeps with the training's."""
    if not isinstance(model, dict):
        return model
    return {k: v for k, v in model.items() if k not in TRAINING_SETTINGS}


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config.json's content in format 3: model settings that belong to training moved to the
    training settings (when a run saved them)."""
    model, train = config.get("model"), config.get("train")
    if not isinstance(model, dict) or not any(k in model for k in TRAINING_SETTINGS):
        return config
    moved = {k: model[k] for k in TRAINING_SETTINGS if k in model}
    train = {**moved, **train} if isinstance(train, dict) else train
    return {**config, "model": upgrade_model(model), "train": train}


LEGACY_NAMES = {"tok_emb.": "embed.tok.", "pos_emb.": "embed.pos.", "embed_norm.": "embed.norm."}


def _renamed(name: str) -> str:
    for old, new in LEGACY_NAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def upgrade_weights(model: nn.Module, state: dict[str, torch.Tensor],
                    weights_format: str) -> dict[str, torch.Tensor]:
    """state (tensors by name, saved in weights_format "1" or "2") in model's current layout."""
    if weights_format == "1":
        state = {_renamed(name): t for name, t in state.items()}
    return stack_separate_projections(model, state)


def stack_separate_projections(model: nn.Module,
                               state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """state with each attention layer's separate `q`, `k`, `v` weights and biases stacked into
    the fused projection. Tensors that cannot be stacked (other widths) are left as they are, for
    load_state_dict to report."""
    state = dict(state)
    for name, module in model.named_modules():
        if not isinstance(module, MultiHeadAttention):
            continue
        prefix = f"{name}." if name else ""
        fused, parts = ("kv", ("k", "v")) if module.cross else ("qkv", ("q", "k", "v"))
        for param in ("weight", "bias"):
            old = [f"{prefix}{part}.{param}" for part in parts]
            new = f"{prefix}{fused}.{param}"
            if new in state or not all(n in state for n in old):
                continue
            tensors = [state[n] for n in old]
            if all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
                state[new] = torch.cat(tensors)
                for n in old:
                    del state[n]
    return state


def stack_fused_states(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """An optimizer state_dict saved when the model's fused linear layers (FusedLinear: the
    attention's W_Q, W_K, W_V) were separate layers, rewritten for optimizer's parameters: each
    fused weight or bias takes the place of its maps' entries, their moments stacked in map order
    as the weights are. A state_dict that does not have that shape comes back unchanged, for the
    loader to accept or refuse."""
    maps = {id(p): len(m.widths) for m in model.modules() if isinstance(m, FusedLinear)
            for p in (m.weight, m.bias) if p is not None}
    groups = [group["params"] for group in optimizer.param_groups]
    old_sizes = [sum(maps.get(id(p), 1) for p in params) for params in groups]
    saved_groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if (not maps or not isinstance(saved_groups, list) or len(saved_groups) != len(groups)
            or [len(g.get("params", ())) for g in saved_groups] != old_sizes):
        return saved
    state, new_state, old, new = saved.get("state", {}), {}, 0, 0
    for params in groups:
        for p in params:
            n = maps.get(id(p), 1)
            entries = [state[i] for i in range(old, old + n) if i in state]
            if len(entries) == n:
                new_state[new] = {key: torch.cat([e[key] for e in entries]) if torch.is_tensor(
                    value) and value.dim() > 0 else value for key, value in entries[0].items()}
            old, new = old + n, new + 1
    new_groups, start = [], 0
    for group, params in zip(saved_groups, groups):
        new_groups.append({**group, "params": list(range(start, start + len(params)))})
        start += len(params)
    return {"state": new_state, "param_groups": new_groups}
