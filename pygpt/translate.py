"""`python -m pygpt.translate --ckpt runs/mt --text "Ein Hund läuft."`: translate with an
encoder-decoder checkpoint (arch seq2seq), by beam search (default beam 4) or greedy decoding.

`--file src.txt` translates every line of a file (UTF-8, or gzip by a .gz name), batched longest
first (pygpt.decoding.translate_texts), and writes the translations in input order, one per line, to
stdout or `--out` (written atomically); blank lines stay blank. With `--ref ref.txt` (the
reference translations, line by line) it prints sacreBLEU's BLEU, the lowercased BLEU and chrF
to stderr (pygpt.tasks.bleu).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from pygpt.mixed_precision import autocast
from pygpt.tasks.bleu import score
from pygpt.storage.checkpoint import load
from pygpt.config.flags import add_model_flags, use_threads
from pygpt.storage.atomic import atomic_write_text
from pygpt.models import Seq2Seq
from pygpt.data.parallel import read_lines
from pygpt.decoding.translate_texts import BATCH_SIZE, SPECIALS, translate_texts
from pygpt.tokenizer import require_specials
from pygpt.decoding.beam_search import Search
from pygpt_runtime.onnx_search import LENGTH_PENALTY_HELP
from pygpt_runtime.cli_checks import utf8_text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pygpt.translate",
                                description=__doc__.split(":")[0])
    p.add_argument("--ckpt", default="out", help="checkpoint folder (default: out)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", default=None, help="a sentence to translate")
    source.add_argument("--file", default=None, help="a file to translate, line by line")
    p.add_argument("--ref", default=None, help="--file's reference translations: print BLEU")
    p.add_argument("--out", default=None, help="write --file's translations here (default: "
                                               "stdout)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default 4; 1: greedy)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (same as --beam 1)")
    p.add_argument("--length-penalty", type=float, default=0.6,
                   help=f"{LENGTH_PENALTY_HELP} (default 0.6)")
    p.add_argument("--max-len-extra", type=int, default=50,
                   help="a translation holds at most source tokens + this many (default 50)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                   help=f"sentences per batch (default {BATCH_SIZE})")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    add_model_flags(p)
    return p


def _inputs(args: argparse.Namespace) -> tuple[list[str], Optional[list[str]]]:
    """The sentences to translate and the references (None without --ref)."""
    if args.text is not None:
        if args.ref is not None or args.out is not None:
            raise ValueError("--ref and --out go with --file, not --text")
        return [utf8_text(args.text, "--text")], None
    sources = list(read_lines(args.file))
    if args.ref is None:
        return sources, None
    refs = list(read_lines(args.ref))
    if len(refs) != len(sources):
        raise ValueError(f"{args.file} has {len(sources)} lines but {args.ref} has {len(refs)}: "
                         "line i of the reference must translate line i of the source")
    return sources, refs


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        use_threads(args.threads)
        search = Search(beam=1 if args.greedy else args.beam, length_penalty=args.length_penalty,
                        max_extra=args.max_len_extra)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
        sources, refs = _inputs(args)
        model, tokenizer = load(args.ckpt, kernels=args.kernels)
        if not isinstance(model, Seq2Seq):
            raise ValueError(f"{args.ckpt} holds a {model.config.arch} model, which does not "
                             "translate (that needs an arch seq2seq checkpoint)")
        require_specials(tokenizer.special_tokens, SPECIALS, "translation")
        with autocast("cpu", args.dtype):
            translations, cut = translate_texts(model, tokenizer, sources, search,
                                                args.batch_size)
        scores = score(translations, refs) if refs is not None else None
        text = "".join(t + "\n" for t in translations)
        if args.out is not None:
            atomic_write_text(Path(args.out), text)
    except (ValueError, OSError) as e:  # OSError: a missing file, or --out not writable
        raise SystemExit(f"error: {e}") from None
    if cut:
        print(f"warning: {cut} source line(s) longer than the model's {model.config.block_size} "
              "positions were cut to them", file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
    if scores is not None:
        print(scores.describe(), file=sys.stderr)


if __name__ == "__main__":
    main()
