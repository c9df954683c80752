"""Greedy decoding and beam search for an exported encoder-decoder, in numpy (the deployment
side cannot import pygpt): step for step the rules of pygpt.translation_search, which takes its
Search settings and length penalty from here, so that a translation here is the one
python -m pygpt.translate gives, token for token.

A sentence's output stops at [EOS] (not included) or after its maximum length: src_len +
max_extra tokens, or max_len if given, and never more than block_size. The banned ids ([PAD]
and [BOS]) are never chosen. Beam search (fairseq's): each step scores every extension of the K
live hypotheses by total log-probability and takes the best 2K; those among the best K that end
in [EOS] (or reach the maximum length) are finished, the best K others live on; a sentence is
done with K finished hypotheses, and its translation is the finished one with the best score
divided by GNMT's length penalty ((5 + n) / 6) ** alpha, n counting [EOS]. Beam 1 is greedy.

The model (OnnxSeq2Seq in onnx_translate.py) gives `encode(src, mask)`, `first_step(ids,
hidden, mask)` -> (logits, decoder past, encoder past) and `next_step(ids, mask, decoder past,
encoder past)` -> (logits, decoder past).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np


@dataclass
class Search:
    beam: int = 1  # hypotheses kept per sentence; 1: greedy
    length_penalty: float = 0.6  # GNMT's alpha (the Transformer paper's 0.6)
    max_extra: int = 50  # a translation holds at most src_len + max_extra tokens ...
    max_len: Optional[int] = None  # ... or, if given, at most max_len

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam must be at least 1, got {self.beam}")
        if self.max_extra < 0:
            raise ValueError(f"max_extra must not be negative, got {self.max_extra}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {self.max_len}")


def length_penalty(n: int, alpha: float) -> float:
    """GNMT's ((5 + n) / 6) ** alpha for a hypothesis of n tokens."""
    return ((5 + n) / 6) ** alpha


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float32)
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class _Rows:
    """The decoding state whose rows move together: the encoder's output (first step only),
    its mask, and the decoder and encoder pasts."""

    def __init__(self, model: Any, src: np.ndarray, lengths: np.ndarray):
        self.model = model
        self.mask = (np.arange(src.shape[1])[None] < lengths[:, None]).astype(np.int64)
        self.hidden = model.encode(src, self.mask)
        self.dec: Optional[list[np.ndarray]] = None
        self.enc: list[np.ndarray] = []

    def log_probs(self, last: np.ndarray, banned: Sequence[int]) -> np.ndarray:
        ids = last[:, None].astype(np.int64)
        if self.dec is None:
            logits, self.dec, self.enc = self.model.first_step(ids, self.hidden, self.mask)
            self.hidden = None
        else:
            logits, self.dec = self.model.next_step(ids, self.mask, self.dec, self.enc)
        logp = log_softmax(logits[:, -1])
        logp[:, list(banned)] = -np.inf
        return logp

    def select(self, rows: np.ndarray, cross: bool) -> None:
        self.dec = [t[rows] for t in self.dec]
        if cross:
            self.enc, self.mask = [t[rows] for t in self.enc], self.mask[rows]


def _limits(block_size: int, lengths: np.ndarray, search: Search) -> list[int]:
    if search.max_len is not None:
        return [min(search.max_len, block_size)] * len(lengths)
    return [min(int(n) + search.max_extra, block_size) for n in lengths]


def greedy(model: Any, src: np.ndarray, lengths: np.ndarray, bos: int, eos: int,
           search: Search, banned: Sequence[int] = ()) -> list[list[int]]:
    limits = _limits(model.block_size, lengths, search)
    state = _Rows(model, src, lengths)
    out: list[list[int]] = [[] for _ in limits]
    active = list(range(len(limits)))
    last = np.full(len(active), bos, dtype=np.int64)
    while active:
        last = state.log_probs(last, banned).argmax(axis=-1)
        keep = []
        for row, (s, token) in enumerate(zip(active, last.tolist())):
            if token != eos:
                out[s].append(token)
            if token != eos and len(out[s]) < limits[s]:
                keep.append(row)
        if len(keep) < len(active):
            rows = np.array(keep, dtype=np.int64)
            state.select(rows, cross=True)
            active, last = [active[r] for r in keep], last[rows]
    return out


def beam_search(model: Any, src: np.ndarray, lengths: np.ndarray, bos: int, eos: int,
                search: Search, banned: Sequence[int] = ()) -> list[list[int]]:
    limits = _limits(model.block_size, lengths, search)
    K = search.beam
    state = _Rows(model, src, lengths)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in limits]
    active = list(range(len(limits)))
    k = 1  # live hypotheses per live sentence (K after the first step)
    scores = np.zeros((len(active), 1), dtype=np.float32)
    hyps = np.zeros((len(active), 1, 0), dtype=np.int64)
    last = np.full(len(active), bos, dtype=np.int64)
    for t in range(1, max(limits) + 1):
        logp = state.log_probs(last, banned)
        V = logp.shape[-1]
        if t == 1 and V - len(set(banned)) < 2 * K:
            raise ValueError(f"beam {K} needs at least {2 * K} tokens that may be chosen; the "
                             f"vocabulary has {V - len(set(banned))}")
        total = (scores[:, :, None] + logp.reshape(len(active), k, V)).reshape(len(active), k * V)
        index = np.argsort(-total, axis=1, kind="stable")[:, :2 * K]
        top = np.take_along_axis(total, index, axis=1)
        keep, lp = [], length_penalty(t, search.length_penalty)
        for i, s in enumerate(active):
            live = []
            for rank in range(2 * K):
                score, b, token = float(top[i, rank]), index[i, rank] // V, index[i, rank] % V
                if token == eos or t >= limits[s]:
                    if rank < K:
                        tail = [] if token == eos else [int(token)]
                        finished[s].append((score / lp, hyps[i, b].tolist() + tail))
                elif len(live) < K:
                    live.append(rank)
            if len(finished[s]) < K:
                keep.append((i, live))
        if not keep:
            break
        i = np.array([i for i, live in keep for _ in live], dtype=np.int64)
        r = np.array([r for _, live in keep for r in live], dtype=np.int64)
        rows = i * k + index[i, r] // V
        last = index[i, r] % V
        state.select(rows, cross=k != K or len(keep) < len(active))
        hyps = np.concatenate([hyps.reshape(len(active) * k, t - 1)[rows], last[:, None]], axis=1)
        hyps = hyps.reshape(len(keep), K, t)
        scores = top[i, r].reshape(len(keep), K)
        active, k = [active[i] for i, _ in keep], K
    return [max(done, key=lambda f: f[0])[1] for done in finished]
