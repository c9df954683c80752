"""The check that a model's outputs are numbers before anything is chosen from them.

Weights are checked finite when a checkpoint loads, but finite weights can still overflow float32
on some input (say, weights scaled by 1e37): the logits become infinities or NaN, and argmax,
sampling, beam search and a softmax then pick token 0 or print NaN probabilities with exit status
0. Every command that turns a model's outputs into an answer passes them through here first,
as the torch-free runner does with each graph's outputs."""
from __future__ import annotations

import torch


def require_finite(outputs: torch.Tensor) -> torch.Tensor:
    """outputs, unchanged; a ValueError when any of them is NaN or infinite."""
    if not bool(torch.isfinite(outputs).all()):
        raise ValueError("the model's outputs are not finite numbers (NaN or infinity) on this "
                         "input: its weights overflow float32 (a damaged or diverged checkpoint)")
    return outputs
