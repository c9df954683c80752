"""The position encodings a model can use, and what each one is made of: the one map from a
`pos_encoding` name (ModelConfig) to its parts, which the embeddings, the attention layers, the
score bias and the decoder's KV cache read instead of testing names themselves.

Attention alone is blind to order; an encoding gives it order in one of three places: vectors
added to the token embeddings (learned, or the fixed sinusoids of "Attention Is All You Need";
pygpt.nn.position), a rotation of each head's queries and keys (rotary, RoPE; pygpt.nn.rotary),
or a bias of the attention scores by key - query distance (a learned table per head and clipped
distance, or ALiBi's fixed slopes; pygpt.nn.position_bias). "none" uses none of them. A new
encoding is one entry here plus its part's implementation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PositionEncoding:
    """One encoding: which position vectors it adds to the tokens (None: none), whether attention
    rotates queries and keys, and which score bias the attention kernels add (None: none)."""

    name: str
    embedding: Optional[str] = None  # "learned" or "sinusoidal" (pygpt.nn.position)
    rotary: bool = False  # pygpt.nn.rotary
    score_bias: Optional[str] = None  # "relative" or "alibi" (pygpt.nn.position_bias)

    @property
    def relative(self) -> bool:
        """Whether attention sees relative positions only (no absolute vector is added): scores
        do not change when every position shifts by the same amount, so a decoder may keep a
        rolling KV cache past its context length."""
        return self.embedding is None


ENCODINGS: dict[str, PositionEncoding] = {e.name: e for e in (
    PositionEncoding("learned", embedding="learned"),
    PositionEncoding("sinusoidal", embedding="sinusoidal"),
    PositionEncoding("rotary", rotary=True),
    PositionEncoding("relative", score_bias="relative"),
    PositionEncoding("alibi", score_bias="alibi"),
    PositionEncoding("none"),
)}

# The encodings under which a decoder's cache may roll (see PositionEncoding.relative).
RELATIVE_ENCODINGS = tuple(name for name, e in ENCODINGS.items() if e.relative)


def encoding(name: str) -> PositionEncoding:
    """The parts of the encoding called name; a ValueError naming the choices otherwise."""
    if name not in ENCODINGS:
        raise ValueError(f"unknown position encoding {name!r}; choose from "
                         f"{', '.join(ENCODINGS)}")
    return ENCODINGS[name]
