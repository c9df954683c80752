"""The attention of a model, taken apart: for texts run through any family (a GPT's causal
self-attention, a BERT's bidirectional one, a translator's encoder self-attention, decoder
self-attention and cross-attention), every layer's and head's queries, keys and values, the
scaled scores, the position bias, the softmax probabilities, each head's output, their
concatenation and W_O's result.

Our kernels never form the probabilities. Forward hooks on each MultiHeadAttention record its
input as the model runs (on whichever kernel set it is on); the layer's own projections
(MultiHeadAttention.heads, which also rotates rotary queries and keys) give Q, K and V from it,
and pygpt.ops.attention's reference forms the weights (attention_weights), with the causal mask,
the padding and the relative or ALiBi bias the kernel applies. Several texts run as one
right-padded batch, as the model runs them; each text's maps are cut to its own positions.
How a family frames a text for its model (a BERT's [CLS] and [SEP], a translator's target) is
the family's (pygpt.families: attention_inputs); pygpt.families.attention_maps puts the two
together. What `python -m pygpt.attention` draws and explains, for one text or a server's
request."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from pygpt.nn import MultiHeadAttention
from pygpt.nn.position_bias import ScoreBias
from pygpt.ops.attention import attention_weights
from pygpt.tokenizer import Tokenizer

_FORWARD = inspect.signature(MultiHeadAttention.forward)


@dataclass(frozen=True)
class LayerAttention:
    """One attention layer's computation for one text. H heads; Tq queries, Tk keys."""

    part: str  # "self", "encoder", "decoder" or "cross"
    layer: int  # the layer's index in its part
    query_tokens: tuple[str, ...]  # (Tq,)
    key_tokens: tuple[str, ...]  # (Tk,)
    causal: bool
    rotary: bool  # whether q and k were rotated by position (rotary positions)
    scale: float  # 1 / sqrt(query/key width of a head)
    q: torch.Tensor  # (H, Tq, Dk): x W_Q^T (+ b), split into heads (rotated when rotary)
    k: torch.Tensor  # (H, Tk, Dk)
    v: torch.Tensor  # (H, Tk, Dv)
    scores: torch.Tensor  # (H, Tq, Tk): scale * q k^T
    bias: Optional[torch.Tensor]  # (H, Tq, Tk): the relative or ALiBi bias added, or None
    visible: torch.Tensor  # (Tq, Tk) bool: the keys each query sees (causal mask)
    probs: torch.Tensor  # (H, Tq, Tk): softmax of scores + bias over the visible keys, 0 else
    heads: torch.Tensor  # (H, Tq, Dv): probs @ v
    concat: torch.Tensor  # (Tq, H * Dv): the heads side by side
    w_o: Optional[torch.Tensor]  # (dim, H * Dv), None for a layer without output projection
    b_o: Optional[torch.Tensor]  # (dim,) or None
    output: torch.Tensor  # (Tq, dim): concat W_O^T + b_O (concat itself without W_O)
    module_output: torch.Tensor  # (Tq, dim): what the layer itself returned, for checking

    @property
    def n_head(self) -> int:
        return self.probs.shape[0]


@dataclass(frozen=True)
class AttentionMaps:
    """Every attention layer of a model for one text."""

    tokens: tuple[str, ...]  # the input's tokens (a translator: the source's)
    target_tokens: tuple[str, ...]  # a translator: its decoder's input, [BOS] + target; else ()
    parts: dict[str, tuple[LayerAttention, ...]]  # each part's layers, in order
    pos_encoding: str  # the model's position encoding (pygpt.positions)

    def layers(self, part: str) -> tuple[LayerAttention, ...]:
        if part not in self.parts:
            raise ValueError(f"this model has no {part!r} attention; it has "
                             f"{', '.join(self.parts)}")
        return self.parts[part]


@dataclass(frozen=True)
class MapInputs:
    """Texts as a model reads them, framed as its family frames them (pygpt.families: a family's
    attention_inputs), and the model's attention layers by part."""

    rows: list[list[int]]  # each text's token ids as the model reads them (a translator: source)
    target_rows: list[list[int]]  # a translator's decoder inputs, [BOS] + target; else []
    parts: dict[str, list[MultiHeadAttention]]  # each part's attention layers, in order
    run: Callable[[], Any]  # runs the model over every row as one batch


def encode_text(tokenizer: Tokenizer, text: str, most: int, what: str, *,
                specials: bool = False, before: Sequence[int] = (),
                after: Sequence[int] = ()) -> list[int]:
    """text's ids between before and after; a ValueError (one line) for an empty text, one of no
    tokens, or one of more than most ids."""
    if not text:
        raise ValueError(f"the {what} is empty")
    ids = [*before, *tokenizer.encode(text, parse_specials=specials), *after]
    if len(ids) == len(before) + len(after):
        raise ValueError(f"the {what} {text!r} has no tokens")
    if len(ids) > most:
        raise ValueError(f"the {what} is {len(ids)} tokens{' with the specials' if before else ''}"
                         f"; the model takes at most {most}")
    return ids


def batch_rows(rows: Sequence[Sequence[int]], pad: int, device: torch.device
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Right-padded ids (B, T) and the rows' lengths (None when no row is padded)."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    ids = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.int64)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row, dtype=torch.int64)
    padded = bool((lengths < ids.shape[1]).any())
    return ids.to(device), lengths.to(device) if padded else None


class _Recorder:
    """Forward hooks that keep each attention layer's arguments and output of one call."""

    def __init__(self, layers: Sequence[MultiHeadAttention]):
        self.calls: dict[int, tuple[dict[str, Any], torch.Tensor]] = {}
        self.handles = [m.register_forward_hook(self._record, with_kwargs=True) for m in layers]

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        bound = _FORWARD.bind(module, *args, **kwargs)
        bound.apply_defaults()
        self.calls[id(module)] = (bound.arguments, output)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _layer(part: str, index: int, attn: MultiHeadAttention, call: tuple[dict[str, Any], Any],
           query_tokens: list[tuple[str, ...]], key_tokens: list[tuple[str, ...]]
           ) -> list[LayerAttention]:
    """One layer's LayerAttention for each row of the batch it ran."""
    args, output = call
    if args["cache"] is not None:
        raise ValueError("attention maps are computed without a KV cache")
    context = args["context"]
    q, k, v = attn.heads(args["x"], context)
    bias = args["position_bias"] or ScoreBias()
    weights = attention_weights(
        q, k, causal=attn.causal, q_lengths=args["lengths"],
        kv_lengths=args["lengths"] if context is None else args["context_lengths"],
        rel_bias=bias.rel_bias, alibi_slopes=bias.alibi_slopes)
    proj = attn.proj
    layers = []
    for b, (queries, keys) in enumerate(zip(query_tokens, key_tokens)):
        tq, tk = len(queries), len(keys)
        probs = weights.probs[b, :, :tq, :tk]
        heads = probs @ v[b, :, :tk]
        concat = heads.transpose(0, 1).reshape(tq, -1)
        layers.append(LayerAttention(
            part=part, layer=index, query_tokens=queries, key_tokens=keys, causal=attn.causal,
            rotary=attn.rotary is not None and context is None, scale=q.shape[-1] ** -0.5,
            q=q[b, :, :tq], k=k[b, :, :tk], v=v[b, :, :tk],
            scores=weights.scores[b, :, :tq, :tk],
            bias=weights.bias[b, :, :tq, :tk] if weights.bias is not None else None,
            visible=weights.visible[b, 0, :tq, :tk], probs=probs, heads=heads, concat=concat,
            w_o=proj.weight if proj is not None else None,
            b_o=proj.bias if proj is not None else None,
            output=proj(concat) if proj is not None else concat,
            module_output=output[b, :tq]))
    return layers


@torch.inference_mode()
def maps_of(model: nn.Module, tokenizer: Tokenizer, inputs: MapInputs) -> list[AttentionMaps]:
    """Every attention layer of model (in eval mode) for each row of inputs, run as one
    right-padded batch (pygpt.families.attention_maps frames the texts by the model's family)."""
    def labels(ids: list[int]) -> tuple[str, ...]:
        return tuple(tokenizer.decode([i]) for i in ids)

    tokens = [labels(r) for r in inputs.rows]
    target_tokens = [labels(r) for r in inputs.target_rows] or [()] * len(inputs.rows)
    # Which tokens each part's queries and keys are.
    sides = {"self": (tokens, tokens), "encoder": (tokens, tokens),
             "decoder": (target_tokens, target_tokens), "cross": (target_tokens, tokens)}
    recorder = _Recorder([m for layers in inputs.parts.values() for m in layers])
    try:
        inputs.run()
    finally:
        recorder.remove()
    per_part = {part: [_layer(part, i, attn, recorder.calls[id(attn)], *sides[part])
                       for i, attn in enumerate(layers)] for part, layers in inputs.parts.items()}
    return [AttentionMaps(tokens[b], target_tokens[b],
                          {part: tuple(layer[b] for layer in layers)
                           for part, layers in per_part.items()},
                          model.config.pos_encoding) for b in range(len(inputs.rows))]
