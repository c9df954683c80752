"""The distillation loss (Hinton et al., "Distilling the Knowledge in a Neural Network"):
T^2 * KL(softmax(teacher / T) || softmax(student / T)), the mean over the rows distilled, mixed
with the student's usual loss as alpha * that + (1 - alpha) * the usual loss. Every family's
distillation (pygpt.families: `Family.distill_rows`) goes through `distill_loss` here.

Each side's logits are given as LogitRows: the output layer's input (N, C) at the rows that
count with that layer's weight (V, C) and bias, or the (N, V) logits themselves for a small
output (a classifier's). For a large vocabulary the logits are never all made: the rows go
through in chunks of at most pygpt.ops.linear_cross_entropy's CHUNK_BYTES of float32 logits, as
the fused linear + cross-entropy does. Per chunk the teacher's and the student's logits are
made, the chunk's KL summed and the gradient of the student's logits, (q - p) * T / N, turned at
once into the chunk's share of the gradients of the student's input, weight and bias; the
backward only scales those by the incoming gradient. So at any time one chunk of each side's
logits exists, besides the student's gradients (first-order only).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from pygpt.ops.linear_cross_entropy import chunk_rows


class LogitRows(NamedTuple):
    """Logits at N rows: x (N, C) through weight (V, C) and bias (V,), or with weight None, x
    (N, V) are the logits."""
    x: Tensor
    weight: Optional[Tensor] = None
    bias: Optional[Tensor] = None

    @property
    def vocab(self) -> int:
        return self.x.shape[1] if self.weight is None else self.weight.shape[0]

    def logits(self, start: int, end: int) -> Tensor:
        x = self.x[start:end]
        return x if self.weight is None else F.linear(x, self.weight, self.bias)


class _ChunkedKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, teacher: LogitRows, temperature: float,
                chunk_bytes: Optional[int]):
        student = LogitRows(x, weight, bias)
        n, v = x.shape[0], student.vocab
        dtype = torch.promote_types(x.dtype, torch.float32)  # float32 at least
        grads = [torch.zeros_like(t, dtype=dtype) if t is not None and ctx.needs_input_grad[i]
                 else None for i, t in enumerate((x, weight, bias))]
        total = torch.zeros((), dtype=dtype, device=x.device)
        step = chunk_rows(n, v, dtype, chunk_bytes)
        for start in range(0, n, step):
            end = min(n, start + step)
            log_q = F.log_softmax(student.logits(start, end).to(dtype) / temperature, -1)
            log_p = F.log_softmax(teacher.logits(start, end).to(dtype) / temperature, -1)
            p = log_p.exp()
            # 0 * log 0 counts as 0 (a teacher's logit of -inf)
            total += torch.where(p > 0, p * (log_p - log_q), 0).sum()
            g = (log_q.exp() - p) * (temperature / n)  # d(T^2 KL / n) / d(student logits)
            if grads[0] is not None:
                grads[0][start:end] = g if weight is None else g @ weight.to(dtype)
            if grads[1] is not None:
                grads[1] += g.t() @ x[start:end].to(dtype)
            if grads[2] is not None:
                grads[2] += g.sum(0)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in grads))
        ctx.has = [g is not None for g in grads]
        ctx.dtypes = [t.dtype if t is not None else None for t in (x, weight, bias)]
        return (total * temperature ** 2 / max(n, 1)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        grads = [(g * grad_out).to(dtype) if has else None
                 for g, has, dtype in zip(ctx.saved_tensors, ctx.has, ctx.dtypes)]
        return (*grads, None, None, None)


def kl_divergence(student: LogitRows, teacher: LogitRows, temperature: float,
                  chunk_bytes: Optional[int] = None) -> Tensor:
    """T^2 times the mean over the rows of KL(softmax(teacher / T) || softmax(student / T)), with
    gradients into the student's rows (the teacher's are taken as constants); 0 for no rows.
    chunk_bytes: the most bytes of float32 logits of one chunk (default CHUNK_BYTES)."""
    if student.x.shape[0] != teacher.x.shape[0]:
        raise ValueError(f"the student has {student.x.shape[0]} rows to distil, the teacher "
                         f"{teacher.x.shape[0]}")
    if student.vocab != teacher.vocab:
        raise ValueError(f"the student has {student.vocab} outputs, the teacher "
                         f"{teacher.vocab}")
    if not (temperature > 0 and temperature < float("inf")):
        raise ValueError(f"the temperature must be a finite number > 0, got {temperature}")
    teacher = LogitRows(*(t.detach() if t is not None else None for t in teacher))
    return _ChunkedKL.apply(student.x, student.weight, student.bias, teacher, temperature,
                            chunk_bytes)


def distill_loss(loss: Tensor, student: LogitRows, teacher: LogitRows, temperature: float,
                 alpha: float) -> Tensor:
    """alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * loss (the student's usual loss);
    with alpha 0 exactly loss, in value and gradients."""
    return alpha * kl_divergence(student, teacher, temperature) + (1 - alpha) * loss
