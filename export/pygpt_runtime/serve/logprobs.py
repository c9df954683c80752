"""A completion's log-probabilities, in OpenAI's shape: per token, its text, its log-probability
and the `logprobs` most likely tokens at its place with theirs, and where its text begins in the
choice's text:

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}, ...],
     "text_offset": [...]}

They are the model's own: log-softmax of its logits, before temperature, top-k or top-p shape
the draw (as vLLM and OpenAI give them), so they do not depend on the sampling settings. A
prompt's first token, which nothing predicts, has null for both (with echo). A token's text is
the tokenizer's decoding of it alone (a byte-level token that holds part of a character reads
U+FFFD)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

MAX_LOGPROBS = 5  # the most alternatives a request may ask per token (OpenAI's limit)


@dataclass
class Scored:
    """A token and how the model scored it: its log-probability and the best ones at its place
    (None for both: a prompt's first token)."""
    token: int
    logprob: Optional[float]
    top: Optional[list[tuple[int, float]]]


def score(logits: np.ndarray, token: int, n: int) -> Scored:
    """The token's log-probability under logits (vocab,) and the n best (id, log-probability)."""
    z = logits.astype(np.float64)
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())
    best = np.argsort(-logp, kind="stable")[:n]
    return Scored(int(token), float(logp[token]), [(int(i), float(logp[i])) for i in best])


def score_prompt(logits: np.ndarray, ids: list[int], n: int) -> list[Scored]:
    """A prompt's tokens scored by the logits (len(ids), vocab) of a run over it: each token by
    the position before it, the first by none."""
    return [Scored(ids[0], None, None),
            *(score(logits[t - 1], ids[t], n) for t in range(1, len(ids)))]


class Logprobs:
    """One choice's entries as they come (`add`); `take` gives those not given yet."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.entries: list[tuple[Scored, int]] = []  # (scored, its text's offset)
        self.given = 0

    def add(self, scored: Scored, offset: int) -> None:
        self.entries.append((scored, offset))

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def take(self, end: Optional[int] = None) -> dict:
        """OpenAI's object for the entries not given yet, of tokens that begin before `end`
        (the choice's text cut at a stop sequence; None: all)."""
        entries = [(s, at) for s, at in self.entries[self.given:] if end is None or at < end]
        self.given = len(self.entries)
        return {"tokens": [self._text(s.token) for s, _ in entries],
                "token_logprobs": [s.logprob for s, _ in entries],
                "top_logprobs": [None if s.top is None else
                                 {self._text(i): lp for i, lp in s.top} for s, _ in entries],
                "text_offset": [at for _, at in entries]}
