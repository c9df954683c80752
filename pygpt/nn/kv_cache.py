"""The keys and values a decoder has already computed, so that a decode step costs one position.

A KVCache holds one LayerKV per attention layer. An attention layer given its LayerKV appends the
keys and values of the new positions and attends over all of them. The cache's length is the
number of positions it holds; its position is the number seen, which is also where the next
positions start. The two differ only in a rolling cache (a `window`), which keeps the last
`window` positions and drops the oldest as new ones come, for models whose attention depends on
relative positions only (pygpt.positions.RELATIVE_ENCODINGS): decoding goes on past the context
length without recomputing the window.

Storage. A cache given a `capacity` (or a window) allocates (B, H, capacity, D) buffers on its
first append and writes later positions in place; what it hands out are strided views of the
filled part (the attention kernels take them as they are). Past the capacity it doubles; a
rolling cache keeps 2 * window positions of room, and when the room runs out it moves the
window down with one copy, so each token costs O(1) amortised and the view stays one slice in
order (a ring buffer would reorder the keys). Without either, the first append holds the tensors
as given and later ones concatenate: one append per call, as in the exported ONNX graph.

Rows of different lengths (batched generation of prompts of different lengths): the rows are
right-padded; `lengths` (B,) are each row's real positions, each row's new positions are
written at its own end, and `next_positions` gives each row's next position (for position
embeddings and rotary angles). Once every row has the same length the cache is uniform again.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

Positions = Union[int, torch.Tensor]  # one position for every row, or one per row (B,)


def position_ids(start: Positions, T: int,
                 device: torch.device) -> tuple[torch.Tensor, Optional[int]]:
    """The positions of T new entries from start: (T,) from one start for every row, (B, T)
    from one per row (B,); and one past the last (the largest row's), for tables and checks
    (None for per-row starts being traced, as in the ONNX export: the graph's inputs are data,
    so the runner keeps them within the context)."""
    if isinstance(start, torch.Tensor):
        positions = start[:, None] + torch.arange(T, device=device)
        if torch.compiler.is_exporting():
            return positions, None
        return positions, (int(start.max()) if start.numel() else 0) + T
    return torch.arange(start, start + T, device=device), start + T


class LayerKV:
    """One layer's keys and values, each (B, H, length, head_dim); empty until first appended.
    With a window, at most that many positions are kept (the oldest dropped first). Assigning
    k and v (e.g. re-selected rows of a beam search) replaces what is held."""

    def __init__(self, k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                 window: Optional[int] = None, capacity: Optional[int] = None):
        if (k is None) != (v is None):
            raise ValueError("a layer's cache needs both keys and values, or neither")
        if window is not None and window < 1:
            raise ValueError(f"a rolling cache's window must be at least 1, got {window}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"a cache's capacity must be at least 1, got {capacity}")
        self.window, self.capacity = window, capacity
        self._k, self._v = k, v
        self._bufs: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # preallocated storage
        self._start = 0  # where the held positions begin in the buffers
        self.dropped = 0  # positions every row no longer holds (rolling cache)
        self._rows: Optional[list[int]] = None  # each row's real length, when the rows differ
        self._extra: Optional[list[int]] = None  # each row's positions dropped beyond `dropped`
        self.lengths: Optional[torch.Tensor] = None  # _rows as int32 (B,), for the kernels

    @property
    def k(self) -> Optional[torch.Tensor]:
        return self._k

    @k.setter
    def k(self, k: Optional[torch.Tensor]) -> None:
        if self._rows is not None:
            raise ValueError("the rows of this cache differ in length; they cannot be replaced")
        self._k, self._bufs = k, None  # copied into fresh buffers by the next append

    @property
    def v(self) -> Optional[torch.Tensor]:
        return self._v

    @v.setter
    def v(self, v: Optional[torch.Tensor]) -> None:
        if self._rows is not None:
            raise ValueError("the rows of this cache differ in length; they cannot be replaced")
        self._v, self._bufs = v, None

    @property
    def length(self) -> int:
        """Positions held (in a batch of rows of different lengths: the longest row's)."""
        return 0 if self._k is None else self._k.shape[2]

    @property
    def position(self) -> int:
        """The position of the next entry: every position seen, dropped ones included."""
        if self._rows is not None or self._extra is not None:
            raise ValueError("the cache's rows are at different positions; use next_positions")
        return self.dropped + self.length

    @property
    def next_positions(self) -> Positions:
        """Where each row's next position is: an int when all rows agree, else (B,) int64."""
        if self._rows is None and self._extra is None:
            return self.dropped + self.length
        rows = self._rows or [self.length] * len(self._extra)
        extra = self._extra or [0] * len(rows)
        return torch.tensor([self.dropped + e + n for e, n in zip(extra, rows)],
                            device=self._k.device)

    def append(self, k: torch.Tensor, v: torch.Tensor,
               lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds the new positions' keys and values (B, H, T, D); returns all keys and values
        held. lengths (B,): each row's real new positions (right-padded; None: all T), written
        at the row's own end. A rolling cache then drops its oldest beyond the window; once
        full it takes one position at a time, so that each new query sees exactly the last
        `window` positions."""
        if lengths is None and self._rows is None:
            if self.window is None and self.capacity is None:
                return self._concatenate(k, v)
            return self._append_uniform(k, v)
        return self._append_rows(k, v, lengths)

    def _concatenate(self, k: torch.Tensor,
                     v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._k is not None:
            k, v = torch.cat([self._k, k], dim=2), torch.cat([self._v, v], dim=2)
        self._k, self._v = k, v
        return k, v

    def _append_uniform(self, k: torch.Tensor,
                        v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, new = self.length, k.shape[2]
        over = 0 if self.window is None else n + new - self.window
        if over > 0:
            if new > 1:
                raise ValueError(f"a full rolling cache (window {self.window}) takes one "
                                 f"position at a time, got {new}")
            self._start, n, self.dropped = self._start + over, n - over, self.dropped + over
            self._k, self._v = self._k.narrow(2, over, n), self._v.narrow(2, over, n)
        kb, vb = self._room(k, v, n + new)
        kb.narrow(2, self._start + n, new).copy_(k)
        vb.narrow(2, self._start + n, new).copy_(v)
        self._k, self._v = kb.narrow(2, self._start, n + new), vb.narrow(2, self._start, n + new)
        return self._k, self._v

    def _append_rows(self, k: torch.Tensor, v: torch.Tensor,
                     lengths: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        B, new = k.shape[0], k.shape[2]
        if self.window is None and self.capacity is None:
            raise ValueError("rows of different lengths need a cache with a capacity or a window")
        adds = [new] * B if lengths is None else [int(n) for n in lengths.tolist()]
        if len(adds) != B or not all(0 <= a <= new for a in adds):
            raise ValueError(f"lengths must be {B} counts in [0, {new}], got {adds}")
        rows = list(self._rows) if self._rows is not None else [self.length] * B
        full = [] if self.window is None else [b for b in range(B)
                                               if rows[b] + adds[b] > self.window]
        if any(adds[b] > 1 for b in full):
            raise ValueError(f"a full rolling cache (window {self.window}) takes one position "
                             f"at a time per row")
        after = [r - (b in full) + a for b, (r, a) in enumerate(zip(rows, adds))]
        kb, vb = self._room(k, v, max(self.length, *after))
        s = self._start
        if full:  # those rows drop their oldest position: their keys move down by one
            idx = torch.tensor(full, device=k.device)
            for buf in (kb, vb):
                buf[idx, :, s:s + self.window - 1] = buf[idx, :, s + 1:s + self.window]
            self._extra = self._extra or [0] * B
            for b in full:
                rows[b] -= 1
                self._extra[b] += 1
        pairs = [(b, t) for b in range(B) for t in range(adds[b])]
        if pairs:
            if len(pairs) == B * new and new == 1:  # a decode step: one position per row
                src_k, src_v = k.select(2, 0), v.select(2, 0)
                b_idx = torch.arange(B, device=k.device)
                dst = torch.tensor([s + r for r in rows], device=k.device)
            else:
                b_idx = torch.tensor([b for b, _ in pairs], device=k.device)
                t_idx = torch.tensor([t for _, t in pairs], device=k.device)
                dst = torch.tensor([s + rows[b] + t for b, t in pairs], device=k.device)
                src_k, src_v = k[b_idx, :, t_idx], v[b_idx, :, t_idx]
            kb[b_idx, :, dst] = src_k
            vb[b_idx, :, dst] = src_v
        self._set_rows(after)
        return self._k, self._v

    def _set_rows(self, rows: list[int]) -> None:
        """Each row's real length: the view spans the longest; uniform again when all agree."""
        kb, vb = self._bufs
        width = max(rows)
        self._k, self._v = kb.narrow(2, self._start, width), vb.narrow(2, self._start, width)
        if all(r == width for r in rows):
            self._rows, self.lengths = None, None
        else:
            self._rows = rows
            self.lengths = torch.tensor(rows, dtype=torch.int32, device=kb.device)
        if self._extra is not None and all(e == self._extra[0] for e in self._extra):
            self.dropped, self._extra = self.dropped + self._extra[0], None

    def put_rows(self, rows: Sequence[int], other: Optional["LayerKV"]) -> None:
        """Replaces the given rows (batch indices) by other's rows, in order, their positions
        starting at 0 again (a row that re-prefills a window), or empties them (other None)."""
        if self.window is not None or self.dropped or self._extra is not None:
            raise ValueError("put_rows is for caches whose rows start at position 0")
        if self._k is None:
            raise ValueError("put_rows needs a cache that holds rows already")
        B = self._k.shape[0]
        width = other.length if other is not None else 0
        kb, vb = self._room(self._k, self._v, max(self.length, width))
        lengths = self._rows if self._rows is not None else [self.length] * B
        lengths = list(lengths)
        if width:
            idx = torch.tensor(list(rows), device=kb.device)
            kb[idx, :, self._start:self._start + width] = other.k
            vb[idx, :, self._start:self._start + width] = other.v
            theirs = other._rows if other._rows is not None else [width] * len(rows)
        else:
            theirs = [0] * len(rows)
        for b, n in zip(rows, theirs):
            lengths[b] = n
        self._set_rows(lengths)

    def _room(self, k: torch.Tensor, v: torch.Tensor,
              need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers, with room for `need` positions from _start: allocated (holding what
        is held), moved down (rolling) or grown (doubled) as needed."""
        bufs, n = self._bufs, self.length
        if bufs is not None and bufs[0].shape[0] == k.shape[0] \
                and self._start + need <= bufs[0].shape[2]:
            return bufs
        if self._k is not None and self._k.shape[0] != k.shape[0]:
            raise ValueError(f"the cache holds {self._k.shape[0]} rows, got {k.shape[0]}")
        if bufs is not None and self.window is not None:
            # The room is twice the window and the held part starts past its own length, so
            # source and destination do not overlap.
            for buf, held in zip(bufs, (self._k, self._v)):
                buf.narrow(2, 0, n).copy_(held)
        else:
            room = (2 * self.window if self.window is not None
                    else max(self.capacity or 0, need, 2 * n if bufs is not None else 0))
            bufs = tuple(self._buffer(new, held, room)
                         for new, held in ((k, self._k), (v, self._v)))
        self._bufs, self._start = bufs, 0
        self._k, self._v = bufs[0].narrow(2, 0, n), bufs[1].narrow(2, 0, n)
        return bufs

    @staticmethod
    def _buffer(new: torch.Tensor, held: Optional[torch.Tensor], room: int) -> torch.Tensor:
        B, H, _, D = new.shape
        buf = torch.empty(B, H, room, D, dtype=new.dtype, device=new.device)
        if held is not None and held.shape[2]:
            buf.narrow(2, 0, held.shape[2]).copy_(held)
        return buf


class KVCache:
    """Per attention layer, the keys and values of the positions seen so far (with a window:
    of the last `window` of them), in buffers of `capacity` positions when one is given."""

    def __init__(self, n_layer: int, window: Optional[int] = None,
                 capacity: Optional[int] = None):
        self.layers = [LayerKV(window=window, capacity=capacity) for _ in range(n_layer)]

    @classmethod
    def from_tensors(cls, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> "KVCache":
        """A cache holding the given (keys, values) per layer (e.g. an exported graph's past)."""
        cache = cls(0)
        cache.layers = [LayerKV(k, v) for k, v in pairs]
        return cache

    def tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.k, layer.v) for layer in self.layers]

    @property
    def length(self) -> int:
        """Positions held (0 for a new cache)."""
        return self.layers[0].length if self.layers else 0

    @property
    def position(self) -> int:
        """Positions seen so far, where the next ones start (0 for a new cache)."""
        return self.layers[0].position if self.layers else 0

    @property
    def next_positions(self) -> Positions:
        """Where each row's next position is (LayerKV.next_positions)."""
        return self.layers[0].next_positions if self.layers else 0

    def put_rows(self, rows: Sequence[int], other: Optional["KVCache"]) -> None:
        """LayerKV.put_rows in every layer (other: a cache of len(rows) rows, or None)."""
        for i, layer in enumerate(self.layers):
            layer.put_rows(rows, other.layers[i] if other is not None else None)

    def __len__(self) -> int:
        """The number of layers."""
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerKV:
        return self.layers[layer]
