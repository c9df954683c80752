"""Translate with an encoder-decoder exported by pygpt (pygpt.onnx.seq2seq), with onnxruntime
and numpy only (and `tokenizers` for a bpe tokenizer): the deployment side of
python -m pygpt.translate, whose output it reproduces token for token.

    pygpt-run --model runs/mt/onnx --text "Ein Hund läuft."
    pygpt-run --model runs/mt/onnx --file src.txt [--out out.txt]

Options as pygpt.translate's: --beam K (default 4), --greedy, --length-penalty (0.6),
--max-len-extra (50), --batch-size (32); plus --int8 (the int8-quantized graphs) and --threads
(onnxruntime intra-op threads). Sentences are stripped, blank ones stay blank, sources are cut to
the model's positions (a huge line first to text.CHARS_PER_POSITION characters a position, before it
is tokenized), and a file is translated longest first in batches (as
pygpt.decoding.translate_texts does), its translations written in input order.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pygpt_runtime.onnx_search import LENGTH_PENALTY_HELP, Search, beam_search, greedy
from pygpt_runtime.cli_checks import check_threads, utf8_text
from pygpt_runtime.onnx_text import open_session, run_graph
from pygpt_runtime.runner_config import read_config
from pygpt_runtime.text import load_tokenizer, source_text

SPECIALS = ("[PAD]", "[BOS]", "[EOS]")
BATCH_SIZE = 32


class OnnxSeq2Seq:
    """The three onnxruntime sessions of an exported translator."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        self.config = read_config(self.folder, "seq2seq", ", which does not translate")
        if variant not in self.config["models"]:
            raise ValueError(f"no {variant} model in {self.folder} (has: "
                             f"{', '.join(self.config['models'])})")
        self.io = self.config["io"]
        self.sessions = {part: open_session(self.folder / name, threads, self.io[part][0],
                                            self.config)
                         for part, name in self.config["models"][variant].items()}
        self.block_size = self.config["block_size"]
        self.tokenizer = load_tokenizer(self.folder / self.config["tokenizer"]["file"],
                                        self.config["tokenizer"]["kind"],
                                        self.config.get("vocab_size"))
        specials = self.config["special_tokens"]
        missing = [name for name in SPECIALS if name not in specials]
        if missing:
            raise ValueError(f"{self.folder}: the tokenizer lacks {', '.join(missing)}")
        self.pad, self.bos, self.eos = (specials[name] for name in SPECIALS)

    def _run(self, part: str, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        return run_graph(self.sessions[part], dict(zip(self.io[part][0], values)))

    def encode(self, src: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._run("encoder", [src, mask])[0]

    def first_step(self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray):
        """-> logits, the decoder past, the encoder past (per layer key and value each)."""
        logits, *present = self._run("decoder", [ids, hidden, mask])
        per_layer = [present[j:j + 4] for j in range(0, len(present), 4)]
        return (logits, [t for layer in per_layer for t in layer[:2]],
                [t for layer in per_layer for t in layer[2:]])

    def next_step(self, ids: np.ndarray, mask: np.ndarray, dec: list[np.ndarray],
                  enc: list[np.ndarray]):
        """-> logits, the decoder past extended by ids' positions."""
        past = [t for j in range(0, len(dec), 2) for t in (*dec[j:j + 2], *enc[j:j + 2])]
        logits, *present = self._run("decoder_with_past", [ids, mask, *past])
        return logits, present

    def translate_ids(self, sources: Sequence[Sequence[int]], search: Search,
                      batch_size: int = BATCH_SIZE) -> list[list[int]]:
        """As pygpt.decoding.translate_texts.translate_ids: longest first, in batches, in input order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        rows = [list(s[:self.block_size]) for s in sources]
        order = sorted((i for i, r in enumerate(rows) if r), key=lambda i: -len(rows[i]))
        out: list[list[int]] = [[] for _ in rows]
        decode = greedy if search.beam == 1 else beam_search
        for lo in range(0, len(order), batch_size):
            batch = order[lo:lo + batch_size]
            lengths = np.array([len(rows[i]) for i in batch], dtype=np.int64)
            src = np.full((len(batch), int(lengths.max())), self.pad, dtype=np.int64)
            for b, i in enumerate(batch):
                src[b, :len(rows[i])] = rows[i]
            done = decode(self, src, lengths, self.bos, self.eos, search, (self.pad, self.bos))
            for i, ids in zip(batch, done):
                out[i] = ids
        return out

    def translate(self, texts: Sequence[str], search: Search,
                  batch_size: int = BATCH_SIZE) -> list[str]:
        sources = [self.tokenizer.encode(kept) if kept else []
                   for kept, _ in (source_text(t, self.block_size) for t in texts)]
        return [self.tokenizer.decode(ids)
                for ids in self.translate_ids(sources, search, batch_size)]


def read_lines(path: str) -> list[str]:
    """A UTF-8 file's lines (gzip by a .gz name), without their line breaks."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return [raw.rstrip(b"\r\n").decode("utf-8") for raw in f]
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="pygpt-run",
                                description="Translate with a pygpt seq2seq ONNX export.")
    p.add_argument("--model", required=True, help="the export folder (runner.json, *.onnx)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", default=None, help="a sentence to translate")
    source.add_argument("--file", default=None, help="a file to translate, line by line")
    p.add_argument("--out", default=None, help="write --file's translations here")
    p.add_argument("--beam", type=int, default=4, help="beam size (default 4; 1: greedy)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (same as --beam 1)")
    p.add_argument("--length-penalty", type=float, default=0.6,
                   help=f"{LENGTH_PENALTY_HELP} (default 0.6)")
    p.add_argument("--max-len-extra", type=int, default=50,
                   help="a translation holds at most source tokens + this many (default 50)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="sentences per batch")
    p.add_argument("--int8", action="store_true", help="use the int8-quantized graphs")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    args = p.parse_args(argv)
    try:
        search = Search(beam=1 if args.greedy else args.beam, length_penalty=args.length_penalty,
                        max_extra=args.max_len_extra)
        check_threads(args.threads)
        if args.text is not None and args.out is not None:
            raise ValueError("--out goes with --file, not --text")
        texts = ([utf8_text(args.text, "--text")] if args.text is not None
                 else read_lines(args.file))
        model = OnnxSeq2Seq(args.model, "int8" if args.int8 else "fp32", args.threads)
        text = "".join(t + "\n" for t in model.translate(texts, search, args.batch_size))
        if args.out is not None:
            tmp = Path(f"{args.out}.tmp-{os.getpid()}")  # written whole, then renamed
            try:
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, args.out)
            finally:
                tmp.unlink(missing_ok=True)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    if args.out is None:
        sys.stdout.write(text)

