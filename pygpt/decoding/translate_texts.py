"""Translating many sentences, as token ids or as text, in batches (what python -m
pygpt.translate and the training task's validation BLEU share).

The sentences are taken longest first (a stable sort by token count, so equal lengths keep their
input order) and cut into batches of `batch_size`, so that a batch holds sentences of similar
length and little padding; the translations come back in input order. An empty sentence (no
tokens) translates to an empty one without running the model. A source longer than the encoder's
positions is cut to them (`cut` counts those); a text is first cut to CHARS_PER_POSITION characters
a position (pygpt_runtime.text.source_text), far more than its tokens there can use. pygpt_runtime.onnx_seq2seq batches the same
way, so that the ONNX runner's output matches this one's.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch

from pygpt.tokenizer import require_specials
from pygpt.decoding.beam_search import Search, translate
from pygpt_runtime.text import source_text

SPECIALS = ("[PAD]", "[BOS]", "[EOS]")  # a translator's tokenizer has them
BATCH_SIZE = 32  # sentences per batch by default


class Translated(NamedTuple):
    ids: list[list[int]]  # per sentence, in input order, without [BOS] / [EOS]
    cut: int  # sources cut to the encoder's positions


def batch_order(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """The indices of the non-empty sentences of the given token counts, longest first, in
    batches of at most batch_size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i])
    return [order[lo:lo + batch_size] for lo in range(0, len(order), batch_size)]


def translate_ids(model: Any, sources: Sequence[Sequence[int]], special_tokens: dict[str, int],
                  search: Search, batch_size: int = BATCH_SIZE) -> Translated:
    """The translations of token-id sources by model (a pygpt.models.Seq2Seq)."""
    require_specials(special_tokens, SPECIALS, "translation")
    pad, bos, eos = (special_tokens[name] for name in SPECIALS)
    most = model.config.block_size
    rows = [list(s[:most]) for s in sources]
    out: list[list[int]] = [[] for _ in rows]
    device = next(model.parameters()).device
    for batch in batch_order([len(r) for r in rows], batch_size):
        lengths = torch.tensor([len(rows[i]) for i in batch], dtype=torch.int64)
        src = torch.full((len(batch), int(lengths.max())), pad, dtype=torch.int64)
        for b, i in enumerate(batch):
            src[b, :len(rows[i])] = torch.tensor(rows[i], dtype=torch.int64)
        done = translate(model, src.to(device), lengths.to(device), bos=bos, eos=eos,
                         search=search, banned=(pad, bos))
        for i, ids in zip(batch, done):
            out[i] = ids
    return Translated(out, sum(len(s) > most for s in sources))


def translate_texts(model: Any, tokenizer: Any, texts: Sequence[str], search: Search,
                    batch_size: int = BATCH_SIZE) -> tuple[list[str], int]:
    """The translations of texts (each stripped first; blank ones translate to "") and the
    number of sources cut to the encoder's positions."""
    kept = [source_text(t, model.config.block_size) for t in texts]
    sources = [tokenizer.encode(text) if text else [] for text, _ in kept]
    done = translate_ids(model, sources, tokenizer.special_tokens, search, batch_size)
    cut_short = sum(was_cut and len(s) <= model.config.block_size
                    for (_, was_cut), s in zip(kept, sources))  # cut in characters only
    return [tokenizer.decode(ids) for ids in done.ids], done.cut + cut_short
