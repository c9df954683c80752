"""Translating a batch of source sentences with an encoder-decoder (the Translator protocol,
pygpt.models.Seq2Seq): greedy decoding or beam search, batched over the sentences.

The encoder runs once per batch. The decoder runs one position per step against a DecoderCache:
its self-attention keys and values grow by a position per step, and its cross-attention keys and
values of the encoder's output are computed on the first step only. The rows of the cache (and
of the memory and its lengths) are selected with `cache.select` whenever the hypotheses change:
in beam search each step's surviving hypotheses pick the rows they extend, and sentences that
are done leave the batch. Cross-attention rows are only re-selected when a sentence leaves or
the first step fans each sentence out into its beams, since every beam of a sentence shares them.

A sentence's output stops at [EOS] (not included) or after its maximum length: src_len +
max_extra tokens, or max_len if given, and never more than the decoder's positions allow.
The `banned` ids (a translator passes [PAD] and [BOS]) are never chosen.

Beam search (beam K) follows fairseq's: each step scores every extension of the K live
hypotheses by total log-probability and takes the best 2K; those among the best K that end in
[EOS] (or reach the maximum length) are finished, and the best K others live on. A sentence is
done once it has K finished hypotheses; its translation is the finished one with the best score
divided by GNMT's length penalty ((5 + n) / 6) ** alpha, n counting [EOS] (alpha 0: the plain
total log-probability; larger alphas favour longer output). Beam 1 is greedy decoding.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch

from pygpt_runtime.onnx_search import Search, length_penalty


class Translator(Protocol):
    max_target_length: int  # the decoder's positions ([BOS] included)

    def encode(self, src: torch.Tensor, src_lengths: Optional[torch.Tensor]) -> torch.Tensor:
        """src (B, S) with src_lengths (B,) real tokens -> memory (B, S, dim)."""

    def new_decoder_cache(self) -> Any:
        """An empty cache with `.length` and `.select(rows, cross=...)` (a DecoderCache)."""

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               memory_lengths: Optional[torch.Tensor], cache: Any) -> torch.Tensor:
        """tgt_in (B, T) after the cached positions -> logits (B, T, V); extends the cache."""


def _limits(model: Translator, src_lengths: torch.Tensor, search: Search) -> list[int]:
    """The most tokens each sentence's translation may hold."""
    most = model.max_target_length
    if search.max_len is not None:
        return [min(search.max_len, most)] * len(src_lengths)
    return [min(int(n) + search.max_extra, most) for n in src_lengths.tolist()]


class _Rows:
    """The state every decoding step shares: the encoder's output and lengths per row, and the
    cache, whose rows move together."""

    def __init__(self, model: Translator, src: torch.Tensor, src_lengths: torch.Tensor):
        self.model = model
        self.memory, self.lengths = model.encode(src, src_lengths), src_lengths
        self.cache = model.new_decoder_cache()

    def log_probs(self, last: torch.Tensor, banned: Sequence[int]) -> torch.Tensor:
        """Next-token log-probabilities (rows, V) after the tokens last (rows,)."""
        logits = self.model.decode(last[:, None], self.memory, self.lengths, self.cache)[:, -1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        logp[:, list(banned)] = float("-inf")
        return logp

    def select(self, rows: torch.Tensor, cross: bool) -> None:
        self.cache.select(rows, cross=cross)
        if cross:
            self.memory, self.lengths = self.memory[rows], self.lengths[rows]


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
    limits = _limits(model, src_lengths, search or Search())
    state = _Rows(model, src, src_lengths)
    out: list[list[int]] = [[] for _ in limits]
    active = list(range(len(limits)))  # the sentence of each row
    last = torch.full((len(active),), bos, dtype=torch.int64, device=src.device)
    while active:
        last = state.log_probs(last, banned).argmax(dim=-1)
        keep = []
        for row, (s, token) in enumerate(zip(active, last.tolist())):
            if token != eos:
                out[s].append(token)
            if token != eos and len(out[s]) < limits[s]:
                keep.append(row)
        if len(keep) < len(active):
            rows = torch.tensor(keep, dtype=torch.int64, device=src.device)
            state.select(rows, cross=True)
            active, last = [active[r] for r in keep], last[rows]
    return out


def beam_search(model: Translator, src: torch.Tensor, src_lengths: Optional[torch.Tensor],
                bos: int, eos: int, search: Optional[Search] = None,
                banned: Sequence[int] = ()) -> list[list[int]]:
    """The best of `search.beam` hypotheses per sentence of src (B, S) (module docstring)."""
    search = search or Search()
    src_lengths = _check(src, src_lengths)
    limits = _limits(model, src_lengths, search)
    K, device = search.beam, src.device
    state = _Rows(model, src, src_lengths)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in limits]
    active = list(range(len(limits)))  # the live sentences, in row order
    k = 1  # live hypotheses per live sentence (K after the first step)
    scores = torch.zeros(len(active), 1, device=device)  # their total log-probabilities
    hyps = torch.zeros(len(active), 1, 0, dtype=torch.int64, device=device)  # and tokens
    last = torch.full((len(active),), bos, dtype=torch.int64, device=device)
    for t in range(1, max(limits) + 1):
        logp = state.log_probs(last, banned)
        V = logp.shape[-1]
        if t == 1 and V - len(set(banned)) < 2 * K:
            raise ValueError(f"beam {K} needs at least {2 * K} tokens that may be chosen; the "
                             f"vocabulary has {V - len(set(banned))}")
        top, index = (scores[:, :, None] + logp.view(len(active), k, V)).view(
            len(active), k * V).topk(2 * K, dim=1)
        candidates = zip(top.tolist(), (index // V).tolist(), (index % V).tolist())
        keep, lp = [], length_penalty(t, search.length_penalty)
        for i, (s, (scores_i, beams_i, tokens_i)) in enumerate(zip(active, candidates)):
            live = []
            for rank, (score, b, token) in enumerate(zip(scores_i, beams_i, tokens_i)):
                if token == eos or t >= limits[s]:
                    if rank < K:
                        tail = [] if token == eos else [token]
                        finished[s].append((score / lp, hyps[i, b].tolist() + tail))
                elif len(live) < K:
                    live.append(rank)
            if len(finished[s]) < K:
                keep.append((i, live))
        if not keep:
            break
        pick = torch.tensor([[i, r] for i, live in keep for r in live], device=device)
        i, r = pick[:, 0], pick[:, 1]
        rows = i * k + index[i, r] // V  # the rows (hypotheses) the survivors extend
        last = index[i, r] % V
        state.select(rows, cross=k != K or len(keep) < len(active))
        hyps = torch.cat([hyps.view(len(active) * k, t - 1)[rows], last[:, None]], dim=1)
        hyps = hyps.view(len(keep), K, t)
        scores = top[i, r].view(len(keep), K)
        active, k = [active[i] for i, _ in keep], K
    return [max(done, key=lambda f: f[0])[1] for done in finished]


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
