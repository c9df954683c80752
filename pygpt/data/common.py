"""What the data sets of the families share: the label the losses skip, token lines stored
flat, right-padded rows of one or two segments, and the cut of a pair of segments to a budget
(BERT's pretraining pairs and classification inputs, the translator's sentence pairs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

IGNORE_INDEX = -100  # a target the losses skip (padding, unmasked tokens)


@dataclass(frozen=True, eq=False)
class Segments:
    """Tokenized lines: line k is ids[offsets[k]:offsets[k + 1]] (offsets has len(self) + 1)."""
    ids: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def line(self, k: int) -> np.ndarray:
        return self.ids[self.offsets[k]:self.offsets[k + 1]]

    def part(self, start: int, stop: int) -> "Segments":
        """Lines start..stop-1."""
        lo, hi = self.offsets[start], self.offsets[stop]
        return Segments(self.ids[lo:hi], self.offsets[start:stop + 1] - lo)


def pad_rows(rows: Sequence[np.ndarray], firsts: Sequence[int],
             pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, segment_ids, lengths) of token rows right-padded with pad to the longest:
    segment ids 1 from firsts[b] (where segment B starts) to the row's end, 0 elsewhere."""
    lengths = [len(row) for row in rows]
    input_ids = np.full((len(rows), max(lengths)), pad, dtype=np.int64)
    segment_ids = np.zeros_like(input_ids)
    for b, row in enumerate(rows):
        input_ids[b, :lengths[b]] = row
        segment_ids[b, firsts[b]:lengths[b]] = 1
    return (torch.from_numpy(input_ids), torch.from_numpy(segment_ids),
            torch.tensor(lengths, dtype=torch.int64))


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """The lengths of A and B after cutting one token at a time from the end of the longer (B on
    a tie) until len_a + len_b <= budget; computed at once, not token by token."""
    excess = len_a + len_b - budget
    if excess <= 0:
        return len_a, len_b
    gap = min(excess, abs(len_a - len_b))
    len_a, len_b = (len_a - gap, len_b) if len_a > len_b else (len_a, len_b - gap)
    if excess > gap:  # now equal: they shrink in turn, B first
        len_a, len_b = (budget + 1) // 2, budget // 2
    return len_a, len_b
