"""The number type a run or a command computes in (`--dtype`), nanoGPT's mixed precision.

float32 computes everything in float32. bfloat16 and float16 run the model under torch.autocast:
the matrix products in the low type, our ops each by its stated policy (pygpt.ops.precision:
layer norm, softmax statistics and cross-entropy in float32), while the weights, the optimizer
state and the checkpoints stay float32, so a run in any type saves, resumes, exports and
converts alike. float16's narrow range needs loss scaling (torch.amp.GradScaler); bfloat16 has
float32's range and needs none. On CUDA, float32 matrix products use TF32 (as nanoGPT and most
trainers do) and AdamW its fused kernel. The inference commands take --dtype here, the batch
commands (classify, tag, answer) with --batch-size and --kernels.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch

from pygpt.config import DTYPES

def default_dtype(device: str) -> str:
    """bfloat16 on a CUDA device that computes in it (Ampere on), else float32."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available() \
            and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


def check_dtype(dtype: str, device: str) -> None:
    """A one-line ValueError unless the device can run under autocast in dtype."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kind = torch.device(device).type
    if dtype == "float32":
        return
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--dtype {dtype} runs on cpu or cuda, not {device}")
    if dtype == "bfloat16" and kind == "cuda" and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{torch.cuda.get_device_name(torch.device(device))} does not compute "
                         "in bfloat16; use --dtype float16 (with loss scaling) or float32")


def autocast(device: str, dtype: Optional[str]) -> ContextManager:
    """The context a model computes in: autocast to dtype, or nothing for float32 (None: the
    device's default type, as a run settles it)."""
    dtype = dtype or default_dtype(device)
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype))


def grad_scaler(device: str, dtype: str) -> Optional[torch.amp.GradScaler]:
    """float16's loss scaler (its gradients underflow unscaled); None for the other types."""
    if dtype != "float16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def use_tf32(device: str, dtype: str) -> None:
    """TF32 matrix products for a float32 run on CUDA (10 bits of mantissa in the products,
    float32 accumulation), as torch.set_float32_matmul_precision("high") gives."""
    if dtype == "float32" and torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("high")

