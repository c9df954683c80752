"""The number types pygpt's ops compute in, and their autocast policy: one rule for every op.

The kernels compute in float32 or float64 on the CPU and in float32, bfloat16 or float16 on
CUDA, and always accumulate in float32 (float64 for float64 inputs). So that every op takes every
floating type, an op given one its device's kernels lack (bfloat16 or float16 on the CPU, float64
on CUDA) computes in float32 and returns its result in the type it was given.

Under torch.autocast each op follows a policy, as ATen's own ops do:

- LOW: attention, bias_gelu and linear_cross_entropy (whose matmuls are the LM head's) run in
  autocast's type where the device's kernels take it (bfloat16 and float16 on CUDA), else in
  float32.
- FLOAT32: layer_norm, add_layer_norm, cross_entropy and rotary upcast to float32 and return
  float32. Their statistics (mean and variance, the log-sum-exp) and rotary's sines and cosines
  want float32's precision, and so the residual stream stays float32 from block to block while
  the matmuls between run in the low type.

The raw op then runs with autocast off, so a composite op's own matmuls (linear_cross_entropy's)
see the types chosen here. Outside autocast, inputs of different floating types (or a first
input that is not floating) are passed on as they are, so the kernels' own checks name them.
"""
from __future__ import annotations

import enum
from typing import Any, Callable

import torch
from torch import Tensor

# What the kernels compute in, per device type; any other device computes in float32.
KERNEL_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float32, torch.bfloat16, torch.float16),
}


class Policy(enum.Enum):
    """An op's type under autocast (see the module's docstring)."""

    LOW = "low"
    FLOAT32 = "float32"


def compute_dtype(dtype: torch.dtype, device: torch.device, policy: Policy) -> torch.dtype:
    """The type an op of `policy` computes in on `device`, given inputs of `dtype`."""
    if dtype != torch.float64 and _autocasting(device):
        dtype = (torch.get_autocast_dtype(device.type) if policy is Policy.LOW
                 else torch.float32)
    return dtype if dtype in KERNEL_DTYPES.get(device.type, (torch.float32,)) else torch.float32


def call(policy: Policy, raw_op: Callable[..., Any], *args: Any) -> tuple[Any, torch.dtype]:
    """raw_op(*args) with its floating tensors in the type the op computes in and autocast off;
    returns its outputs and the type the public function returns them in (the type computed in
    under autocast, else the inputs' own)."""
    first = next(a for a in args if isinstance(a, Tensor))
    dtypes = {a.dtype for a in args if isinstance(a, Tensor) and a.is_floating_point()}
    autocast = _autocasting(first.device)
    if not first.is_floating_point() or (len(dtypes) > 1 and not autocast):
        return _autocast_off(first, raw_op, *args), first.dtype
    dtype = compute_dtype(first.dtype, first.device, policy)
    args = tuple(_cast(a, dtype) for a in args)
    return _autocast_off(first, raw_op, *args), dtype if autocast else first.dtype


def _autocasting(device: torch.device) -> bool:
    """Whether autocast is on for the device's type (the kernels' devices only: others, such as
    meta, have no autocast to ask)."""
    return device.type in KERNEL_DTYPES and torch.is_autocast_enabled(device.type)


def _cast(a: Any, dtype: torch.dtype) -> Any:
    if isinstance(a, Tensor) and a.is_floating_point() and a.dtype != dtype:
        return a.to(dtype)
    return a


def _autocast_off(like: Tensor, raw_op: Callable[..., Any], *args: Any) -> Any:
    if not _autocasting(like.device):
        return raw_op(*args)
    with torch.autocast(like.device.type, enabled=False):
        return raw_op(*args)

