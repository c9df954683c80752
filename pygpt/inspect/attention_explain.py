"""One attention layer worked through with the model's own numbers, as the from-scratch
tutorials work multi-head attention through on a three-token example: for each head its queries,
keys and values, the scaled scores Q K^T / sqrt(d), the position bias and the mask as the model
applies them, the softmax and the head's output; then the heads' concatenation, W_O and its
result, checked against what the layer itself returned. Tables carry the tokens as row and
column labels; columns wrap at WIDTH characters. Only short inputs (MAX_TOKENS) make readable
tables, so longer ones are refused."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from pygpt.inspect.attention_maps import LayerAttention
from pygpt.inspect.attention_picture import token_label
from pygpt.positions import encoding

MAX_TOKENS = 12  # queries or keys an explanation takes
MAX_PRINTED_W_O = 32 * 32  # W_O is printed up to this many numbers
WIDTH = 100  # characters a table line takes at most
DECIMALS = 4
_CELL = DECIMALS + 5  # "-12.3456" and a space


def check_short(layer: LayerAttention) -> None:
    """A ValueError (one line) for an input too long to explain."""
    longest = max(len(layer.query_tokens), len(layer.key_tokens))
    if longest > MAX_TOKENS:
        raise ValueError(f"--explain takes inputs of at most {MAX_TOKENS} tokens; this one has "
                         f"{longest}")


def _number(value: float) -> str:
    return "-inf" if value == -math.inf else f"{value:.{DECIMALS}f}"


def table(title: str, rows: Sequence[str], columns: Sequence[str],
          values: torch.Tensor) -> list[str]:
    """values (len(rows), len(columns)) under title, the columns in blocks that fit WIDTH."""
    label_width = max(len(r) for r in rows)
    cell = max(_CELL, max(len(c) for c in columns) + 1)
    per_block = max(1, (WIDTH - label_width) // cell)
    lines = [f"{title}:"]
    data = values.detach().float().cpu().tolist()
    for lo in range(0, len(columns), per_block):
        cols = range(lo, min(lo + per_block, len(columns)))
        lines.append(" " * label_width + "".join(f"{columns[j]:>{cell}}" for j in cols))
        lines += [f"{row:<{label_width}}" + "".join(f"{_number(data[i][j]):>{cell}}"
                                                    for j in cols)
                  for i, row in enumerate(rows)]
    return lines + [""]


def _labels(tokens: Sequence[str]) -> list[str]:
    return [f"{i}:{token_label(t)}" for i, t in enumerate(tokens)]


def _dims(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _setting(layer: LayerAttention, pos_encoding: str) -> list[str]:
    """What the positions and the mask do in this layer."""
    parts = encoding(pos_encoding)
    if layer.part == "cross":
        where = "none here: cross-attention compares target positions with source positions"
    elif parts.embedding is not None:
        where = (f"{parts.embedding} position vectors were added to the token embeddings before "
                 "the first layer; attention itself adds nothing")
    elif parts.rotary:
        where = "rotary: Q and K below are already rotated by their positions"
    elif parts.score_bias is not None:
        where = (f"{parts.score_bias}: a bias by key - query distance is added to the scaled "
                 "scores (its table below)")
    else:
        where = "none: attention sees no order"
    mask = ("causal: a query sees its own position and those before it"
            if layer.causal else "none: every query sees every key")
    return [f"positions: {where}", f"mask: {mask} (masked scores are -inf, their weights 0)"]


def _head(layer: LayerAttention, h: int, queries: list[str], keys: list[str]) -> list[str]:
    dk, dv = layer.q.shape[-1], layer.v.shape[-1]
    lines = [f"--- head {h} ---"]
    lines += table(f"Q (head {h}, {len(queries)} x {dk})", queries, _dims("q", dk), layer.q[h])
    lines += table(f"K (head {h}, {len(keys)} x {dk})", keys, _dims("k", dk), layer.k[h])
    lines += table(f"V (head {h}, {len(keys)} x {dv})", keys, _dims("v", dv), layer.v[h])
    lines += table(f"scaled scores Q K^T / sqrt({dk}) (head {h}; rows: queries, columns: keys)",
                   queries, keys, layer.scores[h])
    logits = layer.scores[h]
    if layer.bias is not None:
        lines += table(f"position bias (head {h})", queries, keys, layer.bias[h])
        logits = logits + layer.bias[h]
    lines += table(f"masked scores{' + bias' if layer.bias is not None else ''} (head {h})",
                   queries, keys, torch.where(layer.visible, logits, -math.inf))
    lines += table(f"softmax: the attention weights (head {h}; each row sums to 1)",
                   queries, keys, layer.probs[h])
    lines += table(f"head {h} output = weights V ({len(queries)} x {dv})", queries,
                   _dims("o", dv), layer.heads[h])
    return lines


def explain(layer: LayerAttention, pos_encoding: str, title: Optional[str] = None) -> str:
    """The worked example of one layer (for one text) as text."""
    check_short(layer)
    queries, keys = _labels(layer.query_tokens), _labels(layer.key_tokens)
    H, dk, dv = layer.n_head, layer.q.shape[-1], layer.v.shape[-1]
    lines = [title or f"{layer.part} attention, layer {layer.layer}",
             f"{len(queries)} queries, {len(keys)} keys, {H} heads; query/key width {dk}, "
             f"value width {dv}; scale 1/sqrt({dk}) = {layer.scale:.{DECIMALS}f}",
             *_setting(layer, pos_encoding), ""]
    for h in range(H):
        lines += _head(layer, h, queries, keys)
    width = layer.concat.shape[-1]
    lines += ["--- all heads ---"]
    lines += table(f"concatenation [head 0 | ... | head {H - 1}] ({len(queries)} x {width})",
                   queries, _dims("c", width), layer.concat)
    out_width = layer.output.shape[-1]
    if layer.w_o is None:
        lines += ["no W_O in this model: the concatenation is the layer's output", ""]
    elif layer.w_o.numel() <= MAX_PRINTED_W_O:
        lines += table(f"W_O^T ({width} x {out_width})", _dims("c", width),
                       _dims("y", out_width), layer.w_o.mT)
        if layer.b_o is not None:
            lines += table("b_O", ["b"], _dims("y", out_width), layer.b_o[None])
    else:
        lines += [f"W_O is {out_width} x {width} ({layer.w_o.numel()} numbers, not printed)", ""]
    if layer.w_o is not None:
        bias = " + b_O" if layer.b_o is not None else ""
        lines += table(f"output = concatenation W_O^T{bias} ({len(queries)} x {out_width})",
                       queries, _dims("y", out_width), layer.output)
    gap = (layer.output - layer.module_output).abs().max().item()
    lines.append(f"the layer's own output (its attention kernel) differs from this by at most "
                 f"{gap:.1e}")
    return "\n".join(lines)
