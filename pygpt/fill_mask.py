"""`python -m pygpt.fill_mask --ckpt runs/bert --text "To be, or not to be: that is the [MASK]"`:
the most likely tokens for each [MASK] of a text, from a BERT checkpoint's masked-LM head."""
from __future__ import annotations

import argparse
from typing import Optional

import torch

from pygpt.mixed_precision import autocast
from pygpt.storage.checkpoint import load
from pygpt.config.flags import add_model_flags
from pygpt.decoding.finite import require_finite
from pygpt.models import BERT
from pygpt.tokenizer import Tokenizer, require_specials
from pygpt_runtime.cli_checks import HelpFormatter, exits_cleanly, utf8_text

MASK = "[MASK]"


def require_mask_specials(tokenizer: Tokenizer) -> None:
    """A ValueError unless the tokenizer has the special tokens a fill-mask prompt needs."""
    require_specials(tokenizer.special_tokens,
                     ("[CLS]", "[SEP]", MASK, *tokenizer.encoding_needs), "fill-mask prompts")


@torch.inference_mode()
def fill_mask(model: BERT, tokenizer: Tokenizer, text: str,
              top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] in text, in order, the top_k (token, probability) pairs. The text is one
    segment, [CLS] text [SEP]; "[MASK]" written in it is the mask token."""
    require_mask_specials(tokenizer)
    specials = tokenizer.special_tokens
    ids = [specials["[CLS]"], *tokenizer.encode(text, parse_specials=True), specials["[SEP]"]]
    if len(ids) > model.config.block_size:
        raise ValueError(f"the text is {len(ids)} tokens with [CLS] and [SEP]; the model takes "
                         f"at most {model.config.block_size}")
    idx = torch.tensor([ids])
    at = (idx[0] == specials[MASK]).nonzero().flatten()
    if len(at) == 0:
        raise ValueError(f"the text has no {MASK} to fill")
    probs = require_finite(model.mlm(model.encode(idx))[0, at]).float().softmax(dim=-1)
    best = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[(tokenizer.decode([int(i)]), float(p)) for p, i in zip(row_p, row_i)]
            for row_p, row_i in zip(best.values, best.indices)]


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pygpt.fill_mask", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--ckpt", default="out", help="a BERT checkpoint folder")
    p.add_argument("--text", required=True, help=f"text with one or more {MASK} (required)")
    p.add_argument("--top-k", type=int, default=5, help="fills to show per mask")
    add_model_flags(p)
    args = p.parse_args(argv)
    try:
        if args.top_k < 1:
            raise ValueError("--top-k must be at least 1")
        utf8_text(args.text, "--text")
        model, tokenizer = load(args.ckpt, kernels=args.kernels)
        if not isinstance(model, BERT):
            raise ValueError(f"{args.ckpt} holds a {model.config.arch} model; fill-mask needs a "
                             "bert checkpoint")
        with autocast("cpu", args.dtype):
            fills = fill_mask(model, tokenizer, args.text, args.top_k)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    with exits_cleanly():
        for n, candidates in enumerate(fills, start=1):
            shown = ", ".join(f"{token!r} {prob:.3f}" for token, prob in candidates)
            print(f"{MASK} {n}: {shown}")


if __name__ == "__main__":
    main()
