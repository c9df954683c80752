"""Batches for BERT pretraining: sentence pairs for next-sentence prediction (NSP) and masked
tokens for the masked language model (MLM).

The text's non-empty lines are its segments ("sentences"), tokenized once and streamed from the
file into one flat int32 array plus line offsets (a large text never becomes a list of lists).
The split is 90/10 by tokens at a line boundary and contiguous, so val text is unseen in training.

A pair row is [CLS] A [SEP] B [SEP]: A is one or more consecutive lines from a random place,
grown while it fits half the budget; B is the lines that follow A (NSP label 1) or, half of the
time, lines from a random other place, never the true next line nor overlapping A (label 0); the
longer of A and B is cut one token at a time from its end until the row fits block_size. With
nsp=False a row is [CLS] A [SEP], A whole consecutive lines up to block_size - 2 tokens
(RoBERTa's FULL-SENTENCES), and nsp_labels are all IGNORE_INDEX. Rows are right-padded to the
longest in the batch; `lengths` says where each row's padding starts (attend to nothing past it).

Masking is dynamic (fresh every draw, as RoBERTa) and follows BERT's own code: each row gets
exactly max(1, round(15% of its maskable tokens)) predictions at random positions (so every row
trains the MLM and the rate does not wobble with short rows); specials and padding are never
chosen; of the chosen 80% become [MASK], 10% a random non-special token, 10% stay. Every random
draw comes from the torch.Generator given, so a batch is a function of the generator's state.
"""
from __future__ import annotations

from array import array
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Union

import numpy as np
import torch

from pygpt.data.common import IGNORE_INDEX, Segments, pad_rows, truncate_pair
from pygpt.data.text import read_chunks
from pygpt.tokenizer import require_specials

REQUIRED = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")  # the ones a batch writes


class MLMBatch(NamedTuple):
    """One batch, batch first; `model(*batch)` passes the fields in this order."""
    input_ids: torch.Tensor   # (B, T) int64, masked; [PAD] past lengths
    segment_ids: torch.Tensor  # (B, T) int64: 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
    lengths: torch.Tensor     # (B,) int64: real tokens, specials included; T = lengths.max()
    mlm_labels: torch.Tensor  # (B, T) int64: original id where masked, IGNORE_INDEX elsewhere
    nsp_labels: torch.Tensor  # (B,) int64: 1 = B follows A, 0 = random B; IGNORE_INDEX if no NSP


def file_lines(path: Optional[Union[str, Path]] = None) -> Iterator[str]:
    """The lines of a UTF-8 file (the shipped corpus when path is None), read piece by piece with
    pygpt.data.text.read_chunks (and its errors for missing, empty and non-UTF-8 files)."""
    pending = ""
    for chunk in read_chunks(path):
        *lines, pending = (pending + chunk).split("\n")
        yield from lines
    if pending:
        yield pending


def tokenize_lines(lines: Iterable[str], encode: Callable[[str], list[int]]) -> Segments:
    """The token ids of each non-blank line (stripped of surrounding whitespace) under encode,
    which must not add special tokens itself; lines that encode to nothing are skipped. Lines are
    consumed one at a time, so a generator over a large file streams."""
    ids, offsets = array("i"), array("q", [0])
    for line in lines:
        line = line.strip()
        if line:
            tokens = encode(line)
            if len(tokens):
                ids.extend(tokens)
                offsets.append(len(ids))
    return Segments(np.frombuffer(ids, dtype=f"i{ids.itemsize}") if ids else
                    np.zeros(0, np.int32), np.frombuffer(offsets, dtype=np.int64))


def _lines_end(offsets: np.ndarray, start: int, tokens: int, last: int) -> int:
    """The end (exclusive) of the longest run of whole lines from `start` that holds at most
    `tokens` tokens, at least one line and ending at most at `last`."""
    end = int(np.searchsorted(offsets, offsets[start] + tokens, side="right")) - 1
    return min(max(end, start + 1), last)


def mask_tokens(input_ids: torch.Tensor, lengths: torch.Tensor, special_ids: Iterable[int],
                vocab_size: int, generator: Optional[torch.Generator], mask_id: int,
                probability: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked input_ids, labels) for a (B, T) batch whose row b has lengths[b] real tokens.
    Row b gets max(1, round(probability * n_b)) predictions (0 when n_b is 0) at uniformly random
    positions among its n_b maskable ones (not special, not padding); of those 80% become
    mask_id, 10% a uniformly random id in [0, vocab_size) that is not special, 10% are kept.
    labels hold the original id at the chosen positions and IGNORE_INDEX elsewhere."""
    if not 0 < probability <= 1:
        raise ValueError(f"the masking probability must be in (0, 1], got {probability}")
    specials = torch.tensor(sorted(set(special_ids)), dtype=input_ids.dtype)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[specials[(specials >= 0) & (specials < vocab_size)]] = False
    allowed = allowed.nonzero().flatten().to(input_ids.dtype)
    if len(allowed) == 0:
        raise ValueError(f"a vocabulary of {vocab_size} has no non-special token to draw")
    B, T = input_ids.shape
    maskable = (torch.arange(T) < lengths[:, None]) & ~torch.isin(input_ids, specials)
    n = maskable.sum(1)
    count = torch.where(n > 0, (n * probability).round().clamp(min=1), 0).long()
    scores = torch.rand(B, T, generator=generator).masked_fill(~maskable, 2.0)
    chosen = scores.argsort(1).argsort(1) < count[:, None]  # the count lowest scores per row
    action = torch.rand(B, T, generator=generator)
    random_ids = allowed[torch.randint(len(allowed), (B, T), generator=generator)]
    masked = torch.where(chosen & (action < 0.8), mask_id, input_ids)
    masked = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, masked)
    return masked, torch.where(chosen, input_ids, IGNORE_INDEX)


class MLMBatches:
    """Tokenized lines split 90/10 into train and val, drawn as MLMBatch batches of sentence
    pairs (nsp=True) or single runs of lines (nsp=False), at most block_size tokens a row."""

    def __init__(self, segments: Segments, block_size: int, special_tokens: Mapping[str, int],
                 vocab_size: int, nsp: bool = True, val_fraction: float = 0.1,
                 mask_probability: float = 0.15):
        require_specials(special_tokens, REQUIRED, "masked-LM batches")
        if any(not 0 <= i < vocab_size for i in special_tokens.values()):
            raise ValueError(f"special token ids {dict(special_tokens)} are not all in a "
                             f"vocabulary of {vocab_size}")
        smallest = 5 if nsp else 3
        if block_size < smallest:
            raise ValueError(f"--block-size {block_size} is too small: "
                             + ("[CLS] A [SEP] B [SEP] needs at least 5 tokens" if nsp else
                                "[CLS] A [SEP] needs at least 3 tokens"))
        ids = segments.ids
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"the text's token ids run from {ids.min()} to {ids.max()}, outside "
                             f"a vocabulary of {vocab_size}")
        structural = [special_tokens[name] for name in REQUIRED]
        if np.isin(ids, structural).any():
            raise ValueError(f"the text's token ids contain special tokens {REQUIRED}: the "
                             "tokenizer's encode must not add them (the batches do)")
        self.block_size, self.nsp, self.vocab_size = block_size, nsp, vocab_size
        self.mask_probability = mask_probability
        self.special_ids = sorted(set(special_tokens.values()))
        self.pad, self.cls, self.sep, self.mask_id = structural
        offsets = segments.offsets
        n, total = len(segments), int(offsets[-1])
        cut = int(np.abs(offsets - (1 - val_fraction) * total).argmin())  # nearest line boundary
        self.splits = {"train": segments.part(0, cut), "val": segments.part(cut, n)}
        need = 3 if nsp else 1
        for name, part in self.splits.items():
            if len(part) < need:
                raise ValueError(
                    f"text too short: the {name} split has {len(part)} non-empty line(s), but "
                    + ("a sentence pair needs 3 (A, the line after it, and another for a random "
                       "B)" if nsp else "a row needs 1")
                    + f" (the text has {n} lines and {total} tokens, {val_fraction:.0%} of the "
                    "tokens for val); use a longer text")

    @classmethod
    def from_file(cls, path: Optional[Union[str, Path]], tokenizer, block_size: int,
                  nsp: bool = True, **kwargs) -> "MLMBatches":
        """From a text file (the shipped corpus when path is None) and any tokenizer with
        encode, vocab_size and special_tokens."""
        return cls(tokenize_lines(file_lines(path), tokenizer.encode), block_size,
                   tokenizer.special_tokens, tokenizer.vocab_size, nsp=nsp, **kwargs)

    def batch(self, split: str, batch_size: int,
              generator: Optional[torch.Generator] = None) -> MLMBatch:
        """batch_size random rows of the split, masked, padded to the longest row."""
        part = self.splits[split]
        n, offsets = len(part), part.offsets
        starts = torch.randint(n - 1 if self.nsp else n, (batch_size,), generator=generator)
        coins = (torch.rand(batch_size, generator=generator) < 0.5).tolist()
        picks = torch.rand(batch_size, generator=generator).tolist()
        rows, firsts, nsp_labels = [], [], []
        for b, i in enumerate(starts.tolist()):
            if not self.nsp:
                a = part.ids[offsets[i]:offsets[_lines_end(offsets, i, self.block_size - 2, n)]]
                rows.append([[self.cls], a[:self.block_size - 2], [self.sep]])
                firsts.append(len(rows[-1][1]) + 2)
                continue
            budget = self.block_size - 3
            # A leaves a line after it (the true next) and, with it, one elsewhere (a random B).
            j = _lines_end(offsets, i, budget // 2, min(n - 1, i + n - 2))
            if coins[b]:
                r = j
            else:  # uniform over lines 0..i-1 and j+1..n-1
                u = min(int(picks[b] * (n - (j - i + 1))), n - (j - i + 1) - 1)
                r = u if u < i else u + (j - i + 1)
            a = part.ids[offsets[i]:offsets[j]]
            b_end = _lines_end(offsets, r, budget - len(a), i if r < i else n)  # B stays out of A
            b_ids = part.ids[offsets[r]:offsets[b_end]]
            len_a, len_b = truncate_pair(len(a), len(b_ids), budget)
            rows.append([[self.cls], a[:len_a], [self.sep], b_ids[:len_b], [self.sep]])
            firsts.append(len_a + 2)
            nsp_labels.append(int(coins[b]))
        input_ids, segment_ids, lengths = pad_rows([np.concatenate(row) for row in rows],
                                                   firsts, self.pad)
        masked, labels = mask_tokens(input_ids, lengths, self.special_ids, self.vocab_size,
                                     generator, self.mask_id, self.mask_probability)
        nsp_t = (torch.tensor(nsp_labels, dtype=torch.int64) if self.nsp else
                 torch.full((batch_size,), IGNORE_INDEX, dtype=torch.int64))
        return MLMBatch(masked, segment_ids, lengths, labels, nsp_t)
