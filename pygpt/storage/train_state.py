"""The training state a run saves for --resume (train_state.pt: optimizer, step, token count,
RNG states, float16's loss scale), checked before anything of it is used: a file from elsewhere must hold the types
resuming reads, and an optimizer state must fit the model's parameters, or it is a one-line
error naming the file (pygpt.storage.checkpoint.load_train_state reads it)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch


def check_train_state(state: Any, file: Path) -> None:
    """A ValueError naming file unless state has the types that resuming reads."""
    def fail(what: str) -> ValueError:
        return ValueError(f"{file} is not a pygpt training state: {what}")

    if not isinstance(state, dict):
        raise fail(f"expected a dict, got {type(state).__name__}")
    missing = [key for key in ("step", "optimizer", "data_rng", "torch_rng") if key not in state]
    if missing:
        raise fail(f"missing {', '.join(missing)}")
    for key in ("step", "tokens", "grad_scale_growth"):
        if key in state and (type(state[key]) is not int or state[key] < 0):
            raise fail(f"{key} must be a count, got {state[key]!r}")
    scale = state.get("grad_scale", 1.0)  # float16's loss scale
    if type(scale) is not float or not (0 < scale < math.inf):
        raise fail(f"grad_scale must be a positive number, got {scale!r}")
    for key in ("data_rng", "torch_rng"):
        try:
            torch.Generator().set_state(state[key])
        except (TypeError, RuntimeError) as e:
            raise fail(f"{key} is no random generator state ({str(e).splitlines()[0]})") from None
    optim = state["optimizer"]
    groups = optim.get("param_groups") if isinstance(optim, dict) else None
    if not (isinstance(groups, list) and isinstance(optim.get("state"), dict) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)):
        raise fail("optimizer must be an optimizer's state_dict (state, param_groups)")


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any], file: Path) -> None:
    """Loads saved into optimizer after checking that it fits: the same groups of parameters,
    and every saved state tensor (moments) of its parameter's shape, in floating point."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if [len(g["params"]) for g in saved["param_groups"]] != sizes:
        raise ValueError(f"{file}: the optimizer state does not have the model's groups of "
                         f"{sizes} parameters")
    for index, entry in saved["state"].items():
        if type(index) is not int or not 0 <= index < len(params) or not isinstance(entry, dict):
            raise ValueError(f"{file}: the optimizer state has an entry {index!r} for no "
                             "parameter of the model")
        for key, t in entry.items():
            if not isinstance(t, torch.Tensor) or (t.dim() > 0 and (
                    t.shape != params[index].shape or not t.is_floating_point())):
                raise ValueError(f"{file}: the optimizer's {key} of parameter {index} does not "
                                 f"fit its shape {tuple(params[index].shape)}")
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f"{file}: the optimizer state does not fit the model: {e}") from None
