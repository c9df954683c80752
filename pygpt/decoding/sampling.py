"""Autoregressive decoding for any model that offers `prefill` and `step` (the Decoder protocol):
choosing the next token (greedy, or sampling with temperature, top-k and top-p), the sliding
window past the context length, and the generation loop.

With the cache, the prompt is run once (prefill) and every new token costs one position of
compute. When the window would pass the context length it slides: generation continues from the
last half-context of tokens, re-prefilled into a fresh cache. Without the cache the model re-runs
the same window at every step, so both modes condition on exactly the same tokens and agree.
The ONNX runner in export/ implements the same rules in numpy, without torch.

Several prompts of different lengths decode together (`stream_batch`): right-padded, prefilled
once with each row's length, then stepped together, each row's new token written at the row's
own end of the cache; each row keeps its own window and slides it by the rules above (a row
whose window restarts re-prefills its window but the newest token into its cache rows, and
that token then goes with the others' step). Greedy, each row gets the tokens `stream` gives
for its prompt alone; sampling with one generator per row, each row also draws what it would
alone.

A model whose `rolling_cache` is true (attention that depends on relative positions only) slides
by one token instead: the window is always the last context_length tokens, and its cache drops
the oldest position at each step, never re-prefilled. Without the cache the window is re-run as
above; the two agree exactly for a one-layer model, while deeper cached layers still carry (as
sliding-window attention does) information from tokens that have left the window.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence, Union

import torch

from pygpt.decoding.finite import require_finite


class Decoder(Protocol):
    """What the generation loop needs of a model."""

    context_length: int  # the most positions one window may hold
    # A model may also have `rolling_cache = True`: its cache keeps the last context_length
    # positions by itself, so the window slides without a new prefill (absent means False).

    def prefill(self, idx: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """idx (B, T) -> logits (B, T, V) and a cache of these positions. For stream_batch also
        `prefill(idx, lengths)` (right-padded rows) and a cache with `put_rows(rows, cache)`."""

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
    go to -inf as the temperature goes to 0, where sampling becomes greedy (ties drawn evenly).
    Logits that are not all finite are a ValueError (pygpt.decoding.finite)."""
    require_finite(logits)
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
    # Only the tokens the next prediction sees (at most context + 1), as columns (B,): a step
    # appends one without copying the window.
    window = deque(idx[:, -context:].unbind(1), maxlen=context + 1)
    cache = nxt = None
    rolling = getattr(model, "rolling_cache", False)  # the cache slides with the window
    for _ in range(max_new_tokens):
        start = window_start(0, len(window), context, rolling)
        for _ in range(start):
            window.popleft()
        if start and not rolling:
            cache = None
        if not use_cache or cache is None:
            logits, new_cache = model.prefill(torch.stack(tuple(window), dim=1))
            cache = new_cache if use_cache else None
        else:  # one position against the cache
            logits = model.step(nxt.unsqueeze(1), cache)
        nxt = next_token(logits.select(1, -1), sampling, generator)
        window.append(nxt)
        yield nxt


Prompt = Union[torch.Tensor, Sequence[int]]
Generators = Union[None, torch.Generator, Sequence[torch.Generator]]


def _prompt_rows(prompts: Sequence[Prompt]) -> list[list[int]]:
    """The prompts as lists of token ids, checked: at least one prompt, none empty."""
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt")
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, torch.Tensor) and prompt.dim() != 1:
            raise ValueError(f"prompt {i} must be a 1-D sequence of token ids, got shape "
                             f"{tuple(prompt.shape)}")
        ids = [int(t) for t in (prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)]
        if not ids:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        rows.append(ids)
    return rows


def _prefill_rows(model: Decoder, rows: list[list[int]],
                  device: torch.device) -> tuple[torch.Tensor, Any]:
    """Rows of token ids, right-padded and prefilled together -> each row's last logits (B, V)
    and the cache."""
    lens = [len(r) for r in rows]
    idx = torch.zeros(len(rows), max(lens), dtype=torch.long, device=device)
    for b, r in enumerate(rows):
        idx[b, :len(r)] = torch.tensor(r, dtype=torch.long)
    if all(n == lens[0] for n in lens):
        logits, cache = model.prefill(idx)
    else:
        logits, cache = model.prefill(idx, torch.tensor(lens, device=device))
    last = torch.tensor(lens, device=device) - 1
    return logits[torch.arange(len(rows), device=device), last], cache


def _choose(logits: torch.Tensor, sampling: Sampling, generator: Generators) -> torch.Tensor:
    """next_token for every row: from one generator, or row b from generator[b]."""
    if sampling.greedy or generator is None or isinstance(generator, torch.Generator):
        return next_token(logits, sampling, generator)
    return torch.cat([next_token(logits[b:b + 1], sampling, g) for b, g in enumerate(generator)])


def stream_batch(model: Decoder, prompts: Sequence[Prompt], max_new_tokens: int, *,
                 sampling: Optional[Sampling] = None, use_cache: bool = True,
                 generator: Generators = None, device: Optional[torch.device] = None,
                 observe: Optional[Callable[[torch.Tensor], None]] = None
                 ) -> Iterator[torch.Tensor]:
    """Yields max_new_tokens new tokens (B,), one per prompt, continuing B prompts (1-D tensors
    or lists of token ids, of any lengths >= 1) together. generator: one for all rows (drawn
    from in turn), or a sequence of one per row (row b then samples exactly as `stream` would
    with generator[b] alone). device: where the token tensors go (default: the first tensor
    prompt's, else the CPU). observe: called with each step's logits (B, V) before its tokens
    are drawn (a server's log-probabilities)."""
    rows = _prompt_rows(prompts)
    if generator is not None and not isinstance(generator, torch.Generator) \
            and len(generator) != len(rows):
        raise ValueError(f"{len(generator)} generators for {len(rows)} prompts; give one per "
                         "prompt, or a single one")
    if device is None:
        device = next((p.device for p in prompts if isinstance(p, torch.Tensor)),
                      torch.device("cpu"))
    sampling = sampling or Sampling()
    context = model.context_length
    rolling = getattr(model, "rolling_cache", False)
    windows = [r[-context:] for r in rows]
    cache, nxt = None, None
    for _ in range(max_new_tokens):
        slid = []
        for b, w in enumerate(windows):
            start = window_start(0, len(w), context, rolling)
            if start:
                windows[b] = w[start:]
                slid.append(b)
        if not use_cache:
            logits, _ = _prefill_rows(model, windows, device)
        elif cache is None:
            logits, cache = _prefill_rows(model, windows, device)
        else:
            if slid and not rolling:  # those rows restart: their windows but the newest token
                heads = [windows[b][:-1] for b in slid]
                cache.put_rows(slid, _prefill_rows(model, heads, device)[1] if heads[0] else None)
            logits = model.step(nxt.unsqueeze(1), cache).select(1, -1)
        if observe is not None:
            observe(logits)
        nxt = _choose(logits, sampling, generator)
        for w, t in zip(windows, nxt.tolist()):
            w.append(t)
        yield nxt


class Generates:
    """`stream` and `generate` as methods, for a torch module that is a Decoder. Both run in
    eval mode (restoring the module's mode after) and under inference_mode, which unlike no_grad
    skips the autograd layer of our ops entirely."""

    @torch.inference_mode()
    def stream(self, idx: torch.Tensor, max_new_tokens: int, **options) -> Iterator[torch.Tensor]:
        """Yields each new token (B,) as it is chosen; options as pygpt.decoding.sampling.stream."""
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

    @torch.inference_mode()
    def stream_batch(self, prompts: Sequence[Prompt], max_new_tokens: int,
                     **options) -> Iterator[torch.Tensor]:
        """Yields each step's new tokens (B,), one per prompt; options as
        pygpt.decoding.sampling.stream_batch (the tokens on the module's device)."""
        was_training = self.training
        self.eval()
        try:
            device = next(self.parameters()).device
            yield from stream_batch(self, prompts, max_new_tokens, device=device, **options)
        finally:
            self.train(was_training)

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[Prompt], max_new_tokens: int,
                       **options) -> list[torch.Tensor]:
        """Each prompt (1-D, of any length) extended by max_new_tokens chosen tokens, decoded
        together: a list of 1-D tensors of len(prompt) + max_new_tokens."""
        rows = _prompt_rows(prompts)
        new = list(self.stream_batch(prompts, max_new_tokens, **options))
        new = torch.stack(new, dim=1).tolist() if new else [[] for _ in rows]
        device = next(self.parameters()).device
        return [torch.tensor(r + n, dtype=torch.long, device=device) for r, n in zip(rows, new)]
