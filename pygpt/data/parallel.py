"""Parallel data for translation: a source file and a target file, line i of one translating
line i of the other (UTF-8, plain or gzip-compressed by a .gz name), tokenized once into flat
arrays, and batched by token count.

Files whose line counts differ are refused, with both counts. A pair with an empty side (blank
after stripping) or a side longer than `max_len` tokens is skipped; `summary` says how many of
each. A batch row is the source's tokens; the target enters the decoder as [BOS] + tokens and is
predicted as tokens + [EOS] (so a model with block_size positions takes max_len = block_size -
1). Rows are right-padded: with [PAD] in src and tgt_in, with IGNORE_INDEX (skipped by the loss)
in tgt_out.

Batches (`ParallelCorpus.batches`) hold at most max_tokens tokens counting padding, i.e.
src.numel() + tgt_in.numel() <= max_tokens, and bucket pairs of similar lengths together so
that little is padding: the pairs are shuffled, cut into large chunks, each chunk sorted by
(source, target) length and cut greedily into batches, and the batches of all chunks shuffled.
Every pair is in exactly one batch, and the whole order is a function of the torch.Generator
given; without one the pairs are sorted as one chunk and the batches kept in that order.
"""
from __future__ import annotations

import gzip
import itertools
from array import array
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Union

import numpy as np
import torch

from pygpt.data.common import IGNORE_INDEX, Segments
from pygpt.tokenizer import require_specials

REQUIRED = ("[PAD]", "[BOS]", "[EOS]")  # the specials a batch writes
CHUNK_PAIRS = 1 << 16  # pairs per bucketing chunk


class TranslationBatch(NamedTuple):
    """One batch, batch first; `model(*batch)` passes the fields in this order."""
    src: torch.Tensor  # (B, S) int64: the source's tokens, [PAD] past src_lengths
    src_lengths: torch.Tensor  # (B,) int64; S = src_lengths.max()
    tgt_in: torch.Tensor  # (B, T) int64: [BOS] + the target's tokens, [PAD] past tgt_lengths
    tgt_out: torch.Tensor  # (B, T) int64: the target's tokens + [EOS], IGNORE_INDEX after
    tgt_lengths: torch.Tensor  # (B,) int64: target tokens + 1; T = tgt_lengths.max()


def read_lines(path: Union[str, Path]) -> Iterator[str]:
    """The lines of a UTF-8 text file, or of a gzip-compressed one (a name ending in .gz),
    split at "\n" only and without their line breaks ("\n" or "\r\n")."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a text file")
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    yield raw.rstrip(b"\r\n").decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{path} is not UTF-8 text (line {number} has the invalid "
                                     f"byte 0x{raw[e.start]:02x}); convert it to UTF-8 "
                                     "first") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"no data file at {path}") from None
    except (gzip.BadGzipFile, EOFError) as e:  # not gzip data, or cut short
        raise ValueError(f"cannot read {path}: {e}") from None


def read_pairs(src_path: Union[str, Path],
               tgt_path: Union[str, Path]) -> Iterator[tuple[str, str]]:
    """(source line, target line) pairs of two files; a ValueError with both line counts (after
    the pairs they share) when the counts differ."""
    missing = object()
    n = 0
    for n, (s, t) in enumerate(itertools.zip_longest(read_lines(src_path), read_lines(tgt_path),
                                                     fillvalue=missing), 1):
        if s is missing or t is missing:
            rest = sum(1 for _ in itertools.islice(
                read_lines(tgt_path if s is missing else src_path), n, None))
            n_src, n_tgt = (n - 1, n + rest) if s is missing else (n + rest, n - 1)
            raise ValueError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: line i "
                             "of the source must translate line i of the target")
        yield s, t


def _pad(rows: list[np.ndarray], value: int, first: Optional[int] = None,
         last: Optional[int] = None) -> torch.Tensor:
    """Rows (with `first` before and `last` after each, if given) right-padded with value."""
    extra = (first is not None) + (last is not None)
    out = np.full((len(rows), max(len(r) for r in rows) + extra), value, dtype=np.int64)
    start = int(first is not None)
    for b, row in enumerate(rows):
        if first is not None:
            out[b, 0] = first
        out[b, start:start + len(row)] = row
        if last is not None:
            out[b, start + len(row)] = last
    return torch.from_numpy(out)


def bucket_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                   generator: Optional[torch.Generator] = None,
                   chunk: int = CHUNK_PAIRS) -> list[np.ndarray]:
    """The pair indices of each batch (module docstring) for pairs of src_lengths and
    tgt_lengths tokens (rows of src_length and tgt_length + 1 positions)."""
    n = len(src_lengths)
    rows_s, rows_t = np.asarray(src_lengths, np.int64), np.asarray(tgt_lengths, np.int64) + 1
    if n == 0:
        return []
    longest = int((rows_s + rows_t).max())
    if max_tokens < longest:
        raise ValueError(f"max_tokens {max_tokens} is less than the longest pair's "
                         f"{longest} tokens (source + [BOS] + target); raise it")
    order = (torch.randperm(n, generator=generator).numpy() if generator is not None
             else np.arange(n))
    size = chunk if generator is not None else n
    batches: list[np.ndarray] = []
    for lo in range(0, n, size):
        part = order[lo:lo + size]
        part = part[np.lexsort((rows_t[part], rows_s[part]))]  # stable: by source, then target
        start, max_s, max_t = 0, 0, 0
        for k, i in enumerate(part):
            s, t = max(max_s, rows_s[i]), max(max_t, rows_t[i])
            if (k - start + 1) * (s + t) > max_tokens:
                batches.append(part[start:k])
                start, s, t = k, rows_s[i], rows_t[i]
            max_s, max_t = s, t
        batches.append(part[start:])
    if generator is not None:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


class ParallelCorpus:
    """Tokenized sentence pairs: pair k is src.line(k) -> tgt.line(k)."""

    def __init__(self, src: Segments, tgt: Segments, special_tokens: Mapping[str, int], *,
                 max_len: int, skipped_empty: int = 0, skipped_long: int = 0):
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source segments but {len(tgt)} target ones")
        require_specials(special_tokens, REQUIRED, "translation batches")
        self.src, self.tgt, self.max_len = src, tgt, max_len
        self.pad, self.bos, self.eos = (special_tokens[name] for name in REQUIRED)
        self.skipped_empty, self.skipped_long = skipped_empty, skipped_long

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]], encode: Callable[[str], list[int]],
                   special_tokens: Mapping[str, int], max_len: int) -> "ParallelCorpus":
        """From (source, target) texts, each side stripped and encoded (encode must not add
        special tokens); pairs with an empty side or one over max_len tokens are skipped."""
        if max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {max_len}")
        sides = [(array("i"), array("q", [0])) for _ in range(2)]
        empty = long = 0
        for pair in pairs:
            ids = [encode(text) if text else [] for text in map(str.strip, pair)]
            if not all(ids):
                empty += 1
            elif max(map(len, ids)) > max_len:
                long += 1
            else:
                for (flat, offsets), side in zip(sides, ids):
                    flat.extend(side)
                    offsets.append(len(flat))
        src, tgt = (Segments(np.array(flat, dtype=np.int32), np.array(offsets, dtype=np.int64))
                    for flat, offsets in sides)
        return cls(src, tgt, special_tokens, max_len=max_len, skipped_empty=empty,
                   skipped_long=long)

    @classmethod
    def from_files(cls, src_path: Union[str, Path], tgt_path: Union[str, Path], tokenizer,
                   max_len: int) -> "ParallelCorpus":
        """The pairs of two files (module docstring) under a tokenizer with [PAD] [BOS] [EOS]."""
        require_specials(tokenizer.special_tokens, REQUIRED, "translation batches")
        corpus = cls.from_pairs(read_pairs(src_path, tgt_path), tokenizer.encode,
                                tokenizer.special_tokens, max_len)
        if not len(corpus):
            raise ValueError(f"{src_path} and {tgt_path} hold no usable pairs ({corpus.summary})")
        return corpus

    def __len__(self) -> int:
        return len(self.src)

    @property
    def summary(self) -> str:
        return (f"{len(self)} pairs; skipped {self.skipped_empty} empty, {self.skipped_long} "
                f"longer than {self.max_len} tokens")

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of each pair's source and target (without [BOS] / [EOS])."""
        return np.diff(self.src.offsets), np.diff(self.tgt.offsets)

    def batch(self, indices: Iterable[int]) -> TranslationBatch:
        """The pairs at indices, in that order, as one right-padded batch."""
        indices = [int(i) for i in indices]
        src, tgt = [self.src.line(i) for i in indices], [self.tgt.line(i) for i in indices]
        if not src:
            raise ValueError("a batch needs at least one pair")
        lengths = torch.tensor([len(r) for r in src], dtype=torch.int64)
        tgt_lengths = torch.tensor([len(r) + 1 for r in tgt], dtype=torch.int64)
        tgt_out = _pad(tgt, IGNORE_INDEX, last=self.eos)
        return TranslationBatch(_pad(src, self.pad), lengths, _pad(tgt, self.pad, first=self.bos),
                                tgt_out, tgt_lengths)

    def batches(self, max_tokens: int,
                generator: Optional[torch.Generator] = None) -> Iterator[TranslationBatch]:
        """One pass over every pair in batches of at most max_tokens tokens (module docstring)."""
        for indices in bucket_batches(*self.lengths(), max_tokens, generator):
            yield self.batch(indices)
