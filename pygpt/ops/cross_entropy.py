"""pygpt.ops.cross_entropy: mean softmax cross-entropy with ignore_index and label smoothing.
Here: the public function, the fake implementations of the raw ops (torch.ops.pygpt.cross_entropy
and cross_entropy_backward) and the plain-PyTorch reference (torch_cross_entropy). A loss is not
exported to ONNX, so it has no ONNX translation."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device, stats_dtype
from pygpt.ops.precision import Policy, call


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean softmax cross-entropy of logits (N, V) against int64 targets (N,), as
    `F.cross_entropy`; targets equal to `ignore_index` count for nothing. `label_smoothing` s in
    [0, 1] mixes the uniform distribution into the target, as in `F.cross_entropy`: a row's loss
    is (1 - s) * (lse - x[target]) + s * (lse - mean(x))."""
    (loss, _), dtype = call(Policy.FLOAT32, torch.ops.pygpt.cross_entropy, logits, targets,
                            ignore_index, label_smoothing)
    return loss.to(dtype)


def _check_label_smoothing(op: str, label_smoothing: float) -> None:
    """The kernels' check, also made by the fakes (so that a traced call fails as an eager one)."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be a finite number in [0, 1], got "
                         f"{label_smoothing}")


@torch.library.register_fake("pygpt::cross_entropy")
def _cross_entropy_fake(logits, targets, ignore_index=-100, label_smoothing=0.0):
    check_same_device("pygpt.cross_entropy", logits=logits, targets=targets)
    _check_label_smoothing("pygpt.cross_entropy", label_smoothing)
    return logits.new_empty(()), logits.new_empty(logits.shape[:1], dtype=stats_dtype(logits))


@torch.library.register_fake("pygpt::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, logits, targets, lse, ignore_index,
                                 label_smoothing=0.0):
    check_same_device("pygpt.cross_entropy_backward", logits=logits, grad_loss=grad_loss,
                      targets=targets, lse=lse)
    _check_label_smoothing("pygpt.cross_entropy_backward", label_smoothing)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def torch_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(logits, targets, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
