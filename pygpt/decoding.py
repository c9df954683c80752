"""Autoregressive decoding for any model that offers `prefill` and `step` (the Decoder protocol):
choosing the next token (greedy, or sampling with temperature, top-k and top-p), the sliding
window past the context length, and the generation loop.

With the cache, the prompt is run once (prefill) and every new token costs one position of
compute. When the window would pass the context length it slides: generation continues from the
last half-context of tokens, re-prefilled into a fresh cache. Without the cache the model re-runs
the same window at every step, so both modes condition on exactly the same tokens and agree.
The ONNX runner in export/ implements the same rules in numpy, without torch.

A model whose `rolling_cache` is true (attention that depends on relative positions only) slides
by one token instead: the window is always the last context_length tokens, and its cache drops
the oldest position at each step, never re-prefilled. Without the cache the window is re-run as
above; the two agree exactly for a one-layer model, while deeper cached layers still carry (as
sliding-window attention does) information from tokens that have left the window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Protocol

import torch


class Decoder(Protocol):
    """What the generation loop needs of a model."""

    context_length: int  # the most positions one window may hold
    # A model may also have `rolling_cache = True`: its cache keeps the last context_length
    # positions by itself, so the window slides without a new prefill (absent means False).

    def prefill(self, idx: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """idx (B, T) -> logits (B, T, V) and a cache of these positions."""

    def step(self, idx: torch.Tensor, cache: Any) -> torch.Tensor:
        """idx (B, T) following the cached positions -> logits (B, T, V); extends the cache."""


@dataclass
class Sampling:
    greedy: bool = False  # always the most likely token (the classic tutorial's decoding)
    temperature: float = 1.0
    top_k: Optional[int] = None  # keep only the k most likely tokens
    top_p: Optional[float] = None  # keep the smallest set whose probability reaches p

    def __post_init__(self) -> None:
        if not self.greedy and not 0 < self.temperature < float("inf"):
            raise ValueError(f"temperature must be a finite number > 0 (for argmax decoding use "
                             f"greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def next_token(logits: torch.Tensor, sampling: Sampling,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """logits (B, V) -> token ids (B,). The scaled logits are (logits - max) / temperature in
    float64, so every positive temperature works: the likeliest token stays at 0 and the others
    go to -inf as the temperature goes to 0, where sampling becomes greedy (ties drawn evenly)."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / sampling.temperature
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


def window_keep(context_length: int) -> int:
    """How many tokens a full window keeps when it slides: the last half-context."""
    return max(1, context_length // 2)


def window_start(start: int, length: int, context_length: int, rolling: bool = False) -> int:
    """The first token of the window that predicts token number `length`, given the previous
    window's start. The window grows to context_length tokens, then restarts at the last half
    (rolling: slides by one token)."""
    if length - start <= context_length:
        return start
    return length - (context_length if rolling else window_keep(context_length))


def stream(model: Decoder, idx: torch.Tensor, max_new_tokens: int, *,
           sampling: Optional[Sampling] = None, use_cache: bool = True,
           generator: Optional[torch.Generator] = None) -> Iterator[torch.Tensor]:
    """Yields max_new_tokens new tokens (B,) continuing idx (B, T), T >= 1. It holds only the
    current window, never the whole history, so each token costs the same however long the
    stream runs."""
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"idx must be (batch, time) with at least one token, got {tuple(idx.shape)}")
    sampling = sampling or Sampling()
    context = model.context_length
    window = idx[:, -context:]  # only the tokens the next prediction sees: at most context + 1
    cache = None
    rolling = getattr(model, "rolling_cache", False)  # the cache slides with the window
    for _ in range(max_new_tokens):
        start = window_start(0, window.shape[1], context, rolling)
        if start:
            window, cache = window[:, start:], cache if rolling else None
        if not use_cache:
            logits, _ = model.prefill(window)
        elif cache is None:
            logits, cache = model.prefill(window)
        else:  # one position against the cache
            logits = model.step(window[:, -1:], cache)
        nxt = next_token(logits[:, -1], sampling, generator)
        window = torch.cat([window, nxt[:, None]], dim=1)
        yield nxt


class Generates:
    """`stream` and `generate` as methods, for a torch module that is a Decoder. Both run in
    eval mode (restoring the module's mode after) and under inference_mode, which unlike no_grad
    skips the autograd layer of our ops entirely."""

    @torch.inference_mode()
    def stream(self, idx: torch.Tensor, max_new_tokens: int, **options) -> Iterator[torch.Tensor]:
        """Yields each new token (B,) as it is chosen; options as pygpt.decoding.stream."""
        was_training = self.training
        self.eval()
        try:
            yield from stream(self, idx, max_new_tokens, **options)
        finally:
            self.train(was_training)

    @torch.inference_mode()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, **options) -> torch.Tensor:
        """idx (B, T) extended by max_new_tokens chosen tokens: (B, T + max_new_tokens)."""
        new = list(self.stream(idx, max_new_tokens, **options))
        return torch.cat([idx, torch.stack(new, dim=1)], dim=1) if new else idx
