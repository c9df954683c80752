"""Greedy decoding and beam search for an encoder-decoder, batched over sentences: the rules, once
for both sides (pygpt.decoding.beam_search on torch tensors, and the numpy rows here for an ONNX
export run by onnx_seq2seq.py), so that a translation here is the one python -m
pygpt.translate gives, token for token. Nothing here imports torch or pygpt.

A sentence's output stops at [EOS] (not included) or after its maximum length: src_len +
max_extra tokens, or max_len if given, and never more than the decoder's positions allow. The
banned ids (a translator's [PAD] and [BOS]) are never chosen.

Beam search (beam K) follows fairseq's: each step scores every extension of the K live
hypotheses by total log-probability and takes the best 2K; those among the best K that end in
[EOS] (or reach the maximum length) are finished, and the best K others live on. A sentence is
done once it has K finished hypotheses; its translation is the finished one with the best score
divided by GNMT's length penalty ((5 + n) / 6) ** alpha, n counting [EOS] (alpha 0: the plain
total log-probability; larger alphas favour longer output). Beam 1 is greedy decoding.

The rules (decode_greedy, decode_beams) keep their books in lists and leave the arrays to a
side's DecodingRows: the model's step, choosing rows, and the best tokens (argmax, top-k). The
numpy rows here run the ONNX model (OnnxSeq2Seq in onnx_seq2seq.py), which gives
`encode(src, mask)`, `first_step(ids, hidden, mask)` -> (logits, decoder past, encoder past)
and `next_step(ids, mask, decoder past, encoder past)` -> (logits, decoder past).
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

# The largest length penalty (GNMT's alpha) a search takes; 0 is the smallest. Useful alphas lie
# in 0 .. 2; past this one the penalty of a long hypothesis overflows a float.
MAX_LENGTH_PENALTY = 10.0
LENGTH_PENALTY_HELP = f"GNMT length penalty alpha of beam search, 0 to {MAX_LENGTH_PENALTY:g}"


@dataclass
class Search:
    beam: int = 1  # hypotheses kept per sentence; 1: greedy
    length_penalty: float = 0.6  # GNMT's alpha (the Transformer paper's 0.6)
    max_extra: int = 50  # a translation holds at most src_len + max_extra tokens ...
    max_len: Optional[int] = None  # ... or, if given, at most max_len

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam must be at least 1, got {self.beam}")
        if not 0 <= self.length_penalty <= MAX_LENGTH_PENALTY:  # NaN too
            raise ValueError(f"length_penalty must be from 0 to {MAX_LENGTH_PENALTY:g}, got "
                             f"{self.length_penalty}")
        if self.max_extra < 0:
            raise ValueError(f"max_extra must not be negative, got {self.max_extra}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {self.max_len}")


# Whether the search running in this context should stop: a server sets it for the time of one
# request (tasks.TaskQueue) so that a translation whose client has gone stops at its next step.
stop_requested: ContextVar[Callable[[], bool]] = ContextVar("stop_requested",
                                                            default=lambda: False)


class Stopped(Exception):
    """The search stopped before its end, as stop_requested asked."""


def _go_on() -> None:
    """Raises Stopped if this context's search was asked to stop."""
    if stop_requested.get()():
        raise Stopped("the search was stopped")


def length_penalty(n: int, alpha: float) -> float:
    """GNMT's ((5 + n) / 6) ** alpha for a hypothesis of n tokens."""
    return ((5 + n) / 6) ** alpha


def limits(most: int, lengths: Sequence[int], search: Search) -> list[int]:
    """The most tokens each sentence's translation may hold, for sources of these lengths and a
    decoder of `most` positions."""
    if search.max_len is not None:
        return [min(search.max_len, most)] * len(lengths)
    return [min(int(n) + search.max_extra, most) for n in lengths]


class DecodingRows(Protocol):
    """A side's decoding state, a row per hypothesis (the encoder's output, its mask or lengths,
    the decoder's cache), and the array operations of a step. Arrays are the side's own (torch
    tensors, numpy arrays); what the rules read from them comes back as lists."""

    def log_probs(self, last: list[int], banned: Sequence[int]) -> Any:
        """Next-token log-probabilities (rows, V) after the tokens last, a row each; banned -inf."""

    def select(self, rows: list[int], cross: bool) -> None:
        """Keeps these rows, in this order; the encoder's rows too if cross (a sentence left, or
        the first step fans each sentence out into its beams: a sentence's beams share them)."""

    def argmax(self, logp: Any) -> list[int]:
        """The most likely token of each row of logp."""

    def best(self, scores: list[list[float]], logp: Any,
             n: int) -> tuple[list[list[float]], list[list[int]]]:
        """Per sentence (its k rows of logp, k hypotheses with total log-probabilities scores):
        the n best totals of a hypothesis and a token, and their index hypothesis * V + token."""


def decode_greedy(rows: DecodingRows, most: list[int], bos: int, eos: int,
                  banned: Sequence[int]) -> list[list[int]]:
    """The most likely next token at every step, per sentence (at most most[s] tokens)."""
    out: list[list[int]] = [[] for _ in most]
    active = list(range(len(most)))  # the sentence of each row
    last = [bos] * len(active)
    while active:
        _go_on()
        last = rows.argmax(rows.log_probs(last, banned))
        keep = []
        for row, (s, token) in enumerate(zip(active, last)):
            if token != eos:
                out[s].append(token)
            if token != eos and len(out[s]) < most[s]:
                keep.append(row)
        if len(keep) < len(active):
            rows.select(keep, cross=True)
            active, last = [active[r] for r in keep], [last[r] for r in keep]
    return out


Hypothesis = Optional[tuple]  # (its last token, the Hypothesis it extends); None: empty


def _tokens(hypothesis: Hypothesis) -> list[int]:
    tokens = []
    while hypothesis is not None:
        token, hypothesis = hypothesis
        tokens.append(token)
    return tokens[::-1]


def decode_beams(rows: DecodingRows, most: list[int], bos: int, eos: int, search: Search,
                 banned: Sequence[int]) -> list[list[int]]:
    """The best of `search.beam` hypotheses per sentence (at most most[s] tokens; module
    docstring)."""
    K = search.beam
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in most]
    active = list(range(len(most)))  # the live sentences, in row order
    k = 1  # live hypotheses per live sentence (K after the first step), a row each:
    scores = [[0.0] for _ in active]  # their total log-probabilities, per sentence
    hyps: list[Hypothesis] = [None] * len(active)  # their tokens, per row
    last = [bos] * len(active)
    for t in range(1, max(most) + 1):
        _go_on()
        logp = rows.log_probs(last, banned)
        V = logp.shape[-1]
        if t == 1 and V - len(set(banned)) < 2 * K:
            raise ValueError(f"beam {K} needs at least {2 * K} tokens that may be chosen; the "
                             f"vocabulary has {V - len(set(banned))}")
        top, index = rows.best(scores, logp, 2 * K)
        keep, survivors, lp = [], [], length_penalty(t, search.length_penalty)
        for i, s in enumerate(active):
            live = []  # (row extended, token, total)
            for rank, (score, at) in enumerate(zip(top[i], index[i])):
                row, token = i * k + at // V, at % V
                if token == eos or t >= most[s]:
                    if rank < K:
                        tail = [] if token == eos else [token]
                        finished[s].append((score / lp, _tokens(hyps[row]) + tail))
                elif len(live) < K:
                    live.append((row, token, score))
            if len(finished[s]) < K:
                keep.append(s)
                survivors.append(live)
        if not keep:
            break
        chosen = [c for live in survivors for c in live]
        rows.select([row for row, _, _ in chosen], cross=k != K or len(keep) < len(active))
        hyps = [(token, hyps[row]) for row, token, _ in chosen]
        last = [token for _, token, _ in chosen]
        scores = [[score for _, _, score in live] for live in survivors]
        active, k = keep, K
    return [max(done, key=lambda f: f[0])[1] for done in finished]


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float32)
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class _Rows:
    """The numpy DecodingRows of an ONNX model: the encoder's output (first step only), its mask,
    and the decoder and encoder pasts."""

    def __init__(self, model: Any, src: np.ndarray, lengths: np.ndarray):
        self.model = model
        self.mask = (np.arange(src.shape[1])[None] < lengths[:, None]).astype(np.int64)
        self.hidden = model.encode(src, self.mask)
        self.dec: Optional[list[np.ndarray]] = None
        self.enc: list[np.ndarray] = []

    def log_probs(self, last: list[int], banned: Sequence[int]) -> np.ndarray:
        ids = np.array(last, dtype=np.int64)[:, None]
        if self.dec is None:
            logits, self.dec, self.enc = self.model.first_step(ids, self.hidden, self.mask)
            self.hidden = None
        else:
            logits, self.dec = self.model.next_step(ids, self.mask, self.dec, self.enc)
        logp = log_softmax(logits[:, -1])
        logp[:, list(banned)] = -np.inf
        return logp

    def select(self, rows: list[int], cross: bool) -> None:
        index = np.array(rows, dtype=np.int64)
        self.dec = [t[index] for t in self.dec]
        if cross:
            self.enc, self.mask = [t[index] for t in self.enc], self.mask[index]

    def argmax(self, logp: np.ndarray) -> list[int]:
        return logp.argmax(axis=-1).tolist()

    def best(self, scores: list[list[float]], logp: np.ndarray,
             n: int) -> tuple[list[list[float]], list[list[int]]]:
        start = np.array(scores, dtype=logp.dtype)
        total = (start[:, :, None] + logp.reshape(*start.shape, -1)).reshape(len(scores), -1)
        index = np.argsort(-total, axis=1, kind="stable")[:, :n]
        return np.take_along_axis(total, index, axis=1).tolist(), index.tolist()


def greedy(model: Any, src: np.ndarray, lengths: np.ndarray, bos: int, eos: int,
           search: Search, banned: Sequence[int] = ()) -> list[list[int]]:
    most = limits(model.block_size, lengths.tolist(), search)
    return decode_greedy(_Rows(model, src, lengths), most, bos, eos, banned)


def beam_search(model: Any, src: np.ndarray, lengths: np.ndarray, bos: int, eos: int,
                search: Search, banned: Sequence[int] = ()) -> list[list[int]]:
    most = limits(model.block_size, lengths.tolist(), search)
    return decode_beams(_Rows(model, src, lengths), most, bos, eos, search, banned)
