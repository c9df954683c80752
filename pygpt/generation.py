"""Autoregressive generation with a KV cache and a sliding window.

With the cache, the prompt is run once (prefill) and every new token costs one position of
compute: the attention kernel's causal mode with fewer queries than keys serves that decode step.
When the window would pass the context length, it slides: generation continues from the last
half-context of tokens, re-prefilled into a fresh cache. Without the cache the model re-runs the
same window at every step, so both modes condition on exactly the same tokens and agree.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch

from pygpt.sampling import Sampling, next_token


def window_start(start: int, length: int, block_size: int) -> int:
    """The first token of the window that predicts token number `length`, given the previous
    window's start. The window grows to block_size tokens, then restarts at the last half."""
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


def stream(model, idx: torch.Tensor, max_new_tokens: int, *, sampling: Optional[Sampling] = None,
           use_cache: bool = True, generator: Optional[torch.Generator] = None
           ) -> Iterator[torch.Tensor]:
    """Yields max_new_tokens new tokens (B,) continuing idx (B, T), T >= 1."""
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"idx must be (batch, time) with at least one token, got {tuple(idx.shape)}")
    sampling = sampling or Sampling()
    block_size = model.config.block_size
    was_training = model.training
    model.eval()
    try:
        tokens = idx
        start = max(0, tokens.shape[1] - block_size)
        cache = None
        for _ in range(max_new_tokens):
            length = tokens.shape[1]
            new_start = window_start(start, length, block_size)
            if new_start != start:
                start, cache = new_start, None
            if not use_cache:
                logits = model(tokens[:, start:]).logits
            elif cache is None:  # prefill
                logits, _, cache = model(tokens[:, start:], use_cache=True)
            else:  # one position against the cache
                logits, _, cache = model(tokens[:, -1:], past=cache, use_cache=True)
            nxt = next_token(logits[:, -1], sampling, generator)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            yield nxt
    finally:
        model.train(was_training)
