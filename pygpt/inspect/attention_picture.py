"""Attention drawn: each head's probabilities of one or more layers (pygpt.inspect.attention_maps)
as heatmaps in one PNG, a panel per head, queries down the rows and keys along the columns, each
labelled with its token. Keys a query does not see (the causal mask, padding) are grey, so that
they stand apart from weights near 0. One layer's heads make a near-square grid; several layers
take a row each.

Built with matplotlib's object-oriented API on the Agg canvas, never pyplot (as pygpt.plot), and
written atomically (pygpt.storage.atomic.atomic_write)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence, Union

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pygpt.inspect.attention_maps import LayerAttention
from pygpt.plot import write_png

DPI = 110
_SHOWN = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}  # characters a label cannot show


def token_label(token: str) -> str:
    """A token as an axis label: spaces and line breaks made visible."""
    return "".join(_SHOWN.get(c, c) for c in token) or "∅"


def _panel_inches(n_tokens: int) -> float:
    return min(5.5, max(2.4, 0.16 * n_tokens + 1.0))


def draw_attention(layers: Sequence[LayerAttention], out_path: Union[str, Path],
                   title: str) -> Path:
    """Draws every head of the given layers (of one part, for one text) into the PNG out_path
    (parent folders created); returns its path."""
    if not layers:
        raise ValueError("no layers to draw")
    n_head = max(layer.n_head for layer in layers)  # layers may differ (a pruned model's)
    if len(layers) == 1:
        cols = math.ceil(math.sqrt(n_head))
        rows = math.ceil(n_head / cols)
    else:
        rows, cols = len(layers), n_head
    first = layers[0]
    size = _panel_inches(max(len(first.query_tokens), len(first.key_tokens)))
    fig = Figure(figsize=(cols * size + 1.2, rows * size + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    font = max(4.0, min(9.0, 160.0 / max(len(first.query_tokens), len(first.key_tokens))))
    image = None
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")  # bad: masked keys
    for n, ax in enumerate(axes.flat):
        layer = layers[0] if len(layers) == 1 else layers[n // cols]
        head = n if len(layers) == 1 else n % cols
        if head >= layer.n_head:
            ax.set_axis_off()
            continue
        shown = np.ma.masked_array(layer.probs[head].float().cpu().numpy(),
                                   mask=~layer.visible.cpu().numpy())
        image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(len(layer.key_tokens)),
                      [token_label(t) for t in layer.key_tokens], rotation=90, fontsize=font)
        ax.set_yticks(range(len(layer.query_tokens)),
                      [token_label(t) for t in layer.query_tokens], fontsize=font)
        ax.set_title(f"layer {layer.layer}, head {head}" if len(layers) > 1 else f"head {head}",
                     fontsize=9)
        ax.tick_params(length=0)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")
    fig.suptitle(title)
    fig.supxlabel("keys (what is attended to)", fontsize=9)
    fig.supylabel("queries (the positions attending)", fontsize=9)
    return write_png(fig, out_path, DPI)
