"""`python -m pygpt.attention --ckpt RUN --text "..."`: pictures of a model's attention. Draws
every head's attention weights of a layer (`--layer all`: of every layer) as heatmaps with the
tokens on the axes, into one PNG; `--explain` also prints the layer's multi-head attention worked
through with the model's numbers (Q, K, V, the scaled scores, the softmax, each head's output,
the concatenation and W_O) for a short input.

Any family: a GPT's causal self-attention, a BERT's bidirectional one ([CLS] text [SEP]), and a
translator's encoder self-attention, decoder self-attention and cross-attention (`--part`;
cross-attention by default, which for a trained translator shows the word alignment), with
`--text` as the source and `--target` as the target (default: the model's greedy translation).
The weights are formed by the plain-PyTorch reference from each layer's input
(pygpt.inspect.attention_maps): our kernels never form them. --kernels and --dtype are the
model's, as for the other commands: with --dtype bfloat16 the layers run under autocast, so
the weights are formed from the inputs of a bfloat16 run."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from pygpt.config.flags import add_model_flags, use_threads
from pygpt.inspect.attention_explain import check_short, explain
from pygpt.families import FAMILIES, attention_maps, family
from pygpt.inspect.attention_maps import AttentionMaps
from pygpt.inspect.attention_picture import draw_attention
from pygpt.mixed_precision import autocast
from pygpt.storage.checkpoint import load
from pygpt_runtime.cli_checks import HelpFormatter, exits_cleanly, utf8_text

ALL_LAYERS = "all"
# Every family's attention parts, in the order they run (--part's choices).
PARTS = tuple(dict.fromkeys(p for f in FAMILIES.values() for p in f.attention_parts))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pygpt.attention", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--ckpt", default="out", help="a checkpoint folder of any family "
                                                 "(default: out)")
    p.add_argument("--text", required=True, help="the input (a translator's source; required)")
    p.add_argument("--target", default=None,
                   help="a translator's target text (default: its own greedy translation)")
    p.add_argument("--layer", default="0",
                   help=f"the layer to draw, from 0 (default 0), or {ALL_LAYERS!r}: every layer, "
                        "a row each")
    p.add_argument("--part", default=None, choices=PARTS,
                   help="which attention: self (a GPT or BERT); encoder, decoder or cross (a "
                        "translator; default cross)")
    p.add_argument("--out", default="attention.png", help="the PNG to write (default: "
                                                           "attention.png)")
    p.add_argument("--explain", action="store_true",
                   help="also print the layer's attention worked through with the model's "
                        "numbers (a short input)")
    add_model_flags(p)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    return p


def _layers(maps: AttentionMaps, part: str, layer: str) -> tuple:
    """The layers of part that --layer names."""
    layers = maps.layers(part)
    if layer == ALL_LAYERS:
        return layers
    if not layer.lstrip("-").isdigit() or not 0 <= int(layer) < len(layers):
        raise ValueError(f"--layer {layer}: the model's {part} attention has layers "
                         f"0..{len(layers) - 1} (or {ALL_LAYERS!r})")
    return (layers[int(layer)],)


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        use_threads(args.threads)
        utf8_text(args.text, "--text")
        if args.target is not None:
            utf8_text(args.target, "--target")
        if args.explain and args.layer == ALL_LAYERS:
            raise ValueError("--explain works through one layer; give --layer a number")
        model, tokenizer = load(args.ckpt, kernels=args.kernels)
        fam = family(model.config.arch)
        if args.target is not None and not fam.has_target:
            raise ValueError(f"--target is for a translator; {args.ckpt} holds a "
                             f"{model.config.arch} model")
        part = args.part or fam.default_attention_part
        with autocast("cpu", args.dtype):
            maps = attention_maps(model, tokenizer, [args.text],
                                  [args.target] if fam.has_target else None)[0]
        layers = _layers(maps, part, args.layer)
        if args.explain:
            check_short(layers[0])
        which = f"layer {layers[0].layer}" if len(layers) == 1 else "every layer"
        title = f"{part} attention of {Path(args.ckpt).resolve().name}, {which}"
        written = draw_attention(layers, args.out, title)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    with exits_cleanly():
        if args.explain:
            print(explain(layers[0], maps.pos_encoding, title))
        print(f"wrote {written}")


if __name__ == "__main__":
    main()
