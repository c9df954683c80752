"""Translating a batch of source sentences with an encoder-decoder (the Translator protocol,
pygpt.models.Seq2Seq): greedy decoding or beam search, batched over the sentences. The rules of
both (when a sentence stops, which hypotheses finish or live on, the length penalty, the pick)
are pygpt_runtime.onnx_search's, shared with the ONNX runner; this module gives them the torch
side's rows.

The encoder runs once per batch. The decoder runs one position per step against a DecoderCache:
its self-attention keys and values grow by a position per step, and its cross-attention keys and
values of the encoder's output are computed on the first step only. The rows of the cache (and
of the memory and its lengths) are selected with `cache.select` whenever the hypotheses change:
in beam search each step's surviving hypotheses pick the rows they extend, and sentences that
are done leave the batch. Cross-attention rows are only re-selected when a sentence leaves or
the first step fans each sentence out into its beams, since every beam of a sentence shares them.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch

from pygpt.decoding.finite import require_finite
from pygpt_runtime.onnx_search import Search, decode_beams, decode_greedy, limits


class Translator(Protocol):
    max_target_length: int  # the decoder's positions ([BOS] included)

    def encode(self, src: torch.Tensor, src_lengths: Optional[torch.Tensor]) -> torch.Tensor:
        """src (B, S) with src_lengths (B,) real tokens -> memory (B, S, dim)."""

    def new_decoder_cache(self) -> Any:
        """An empty cache with `.length` and `.select(rows, cross=...)` (a DecoderCache)."""

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               memory_lengths: Optional[torch.Tensor], cache: Any) -> torch.Tensor:
        """tgt_in (B, T) after the cached positions -> logits (B, T, V); extends the cache."""


class _Rows:
    """The torch DecodingRows of pygpt_runtime.onnx_search: the encoder's output and lengths per
    row, and the cache, whose rows move together."""

    def __init__(self, model: Translator, src: torch.Tensor, src_lengths: torch.Tensor):
        self.model, self.device = model, src.device
        self.memory, self.lengths = model.encode(src, src_lengths), src_lengths
        self.cache = model.new_decoder_cache()

    def log_probs(self, last: list[int], banned: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(last, dtype=torch.int64, device=self.device)[:, None]
        logits = self.model.decode(ids, self.memory, self.lengths, self.cache)[:, -1]
        logp = torch.log_softmax(require_finite(logits).float(), dim=-1)
        logp[:, list(banned)] = float("-inf")
        return logp

    def select(self, rows: list[int], cross: bool) -> None:
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self.cache.select(index, cross=cross)
        if cross:
            self.memory, self.lengths = self.memory[index], self.lengths[index]

    def argmax(self, logp: torch.Tensor) -> list[int]:
        return logp.argmax(dim=-1).tolist()

    def best(self, scores: list[list[float]], logp: torch.Tensor,
             n: int) -> tuple[list[list[float]], list[list[int]]]:
        start = torch.tensor(scores, dtype=logp.dtype, device=self.device)
        total = (start[:, :, None] + logp.view(*start.shape, -1)).view(len(scores), -1)
        top, index = total.topk(n, dim=1)
        return top.tolist(), index.tolist()


def _check(src: torch.Tensor, src_lengths: Optional[torch.Tensor]) -> torch.Tensor:
    if src.dim() != 2 or src.shape[1] < 1:
        raise ValueError(f"src must be (batch, time) with at least one position, got shape "
                         f"{tuple(src.shape)}")
    if src_lengths is None:
        return torch.full((src.shape[0],), src.shape[1], dtype=torch.int64, device=src.device)
    if src_lengths.shape != (src.shape[0],):
        raise ValueError(f"src_lengths must be ({src.shape[0]},), got shape "
                         f"{tuple(src_lengths.shape)}")
    return src_lengths


def greedy(model: Translator, src: torch.Tensor, src_lengths: Optional[torch.Tensor], bos: int,
           eos: int, search: Optional[Search] = None,
           banned: Sequence[int] = ()) -> list[list[int]]:
    """The most likely next token at every step, per sentence of src (B, S)."""
    src_lengths = _check(src, src_lengths)
    most = limits(model.max_target_length, src_lengths.tolist(), search or Search())
    return decode_greedy(_Rows(model, src, src_lengths), most, bos, eos, banned)


def beam_search(model: Translator, src: torch.Tensor, src_lengths: Optional[torch.Tensor],
                bos: int, eos: int, search: Optional[Search] = None,
                banned: Sequence[int] = ()) -> list[list[int]]:
    """The best of `search.beam` hypotheses per sentence of src (B, S) (module docstring)."""
    search = search or Search()
    src_lengths = _check(src, src_lengths)
    most = limits(model.max_target_length, src_lengths.tolist(), search)
    return decode_beams(_Rows(model, src, src_lengths), most, bos, eos, search, banned)


@torch.inference_mode()
def translate(model: Any, src: torch.Tensor, src_lengths: Optional[torch.Tensor], *, bos: int,
              eos: int, search: Optional[Search] = None,
              banned: Sequence[int] = ()) -> list[list[int]]:
    """Each sentence's translation (token ids, without [BOS] and [EOS]) by greedy decoding
    (beam 1) or beam search, with the torch module model in eval mode (restored after)."""
    search = search or Search()
    was_training = model.training
    model.eval()
    try:
        decode = greedy if search.beam == 1 else beam_search
        return decode(model, src, src_lengths, bos, eos, search, banned)
    finally:
        model.train(was_training)
