"""What the data sets of the families share: the label the losses skip, token lines stored
flat, right-padded rows of one or two segments, the cut of a pair of segments to a budget
(BERT's pretraining pairs and classification inputs, the translator's sentence pairs), the
fine-tuning sets' batches drawn at random or in order (Rows) and their held-out validation
part."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, TypeVar, Union

import numpy as np
import torch

IGNORE_INDEX = -100  # a target the losses skip (padding, unmasked tokens)
Item = TypeVar("Item")


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


class Rows:
    """A fine-tuning set of encoded rows: a subclass gives len() and batch(which), the rows
    `which` as one padded batch; this gives the draws and passes the tasks ask for."""

    def __len__(self) -> int:
        raise NotImplementedError

    def batch(self, which: Sequence[int]) -> Any:
        raise NotImplementedError

    def draw(self, batch_size: int, generator: Optional[torch.Generator] = None) -> Any:
        """batch_size rows drawn at random (with replacement)."""
        return self.batch(torch.randint(len(self), (batch_size,), generator=generator).tolist())

    def in_order(self, batch_size: int) -> Iterator[Any]:
        """Every row once, in order, batch_size at a time (the last batch may be smaller)."""
        for start in range(0, len(self), batch_size):
            yield self.batch(range(start, min(start + batch_size, len(self))))


def held_out(items: Sequence[Item], fraction: float, seed: int, path: Union[str, Path],
             what: str) -> tuple[list[Item], list[Item]]:
    """(train, val): round(fraction * n) of items (at least one, leaving one to train on),
    each a `what` of the file path, drawn at random with a fixed seed, so the split is a
    function of the file; both keep file order."""
    n = len(items)
    if n < 2:
        raise ValueError(f"{path}: one {what} cannot be split into training and validation; "
                         "give --val-data")
    take = min(max(round(fraction * n), 1), n - 1)
    val = set(torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:take].tolist())
    return ([s for i, s in enumerate(items) if i not in val],
            [s for i, s in enumerate(items) if i in val])
