"""What the fake implementations of pygpt's ops share (each op's module in pygpt.ops): the dtype
of the statistics the kernels return, and the device check the kernels make."""
from __future__ import annotations

from typing import Optional

import torch


def stats_dtype(t: torch.Tensor) -> torch.dtype:
    """Statistics (lse, mean, rstd) stay float32 for half-precision inputs (the CUDA kernels)."""
    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def check_same_device(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """A fake implementation also runs for real calls that mix in a meta tensor; refuse those as
    the kernels do, instead of returning uninitialised outputs."""
    given = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = given[0]
    for name, t in given[1:]:
        if t.device != first.device:
            raise RuntimeError(f"{op}: {name} is on {t.device} but {first_name} is on "
                               f"{first.device}; all tensors must be on the same device")
