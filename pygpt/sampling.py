"""Choosing the next token from the logits: greedy, or sampling with temperature, top-k and
top-p (nucleus). The ONNX runner in export/ does the same in numpy, without torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Sampling:
    greedy: bool = False  # always the most likely token (the classic tutorial's decoding)
    temperature: float = 1.0
    top_k: Optional[int] = None  # keep only the k most likely tokens
    top_p: Optional[float] = None  # keep the smallest set whose probability reaches p

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (for argmax decoding use greedy), "
                             f"got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def next_token(logits: torch.Tensor, sampling: Sampling,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """logits (B, V) -> token ids (B,)."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the ones before it already reach top_p; the first always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
