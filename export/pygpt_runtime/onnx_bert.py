"""Fill-mask and classification with a BERT exported by `python -m pygpt.export`, with numpy
and onnxruntime only (the deployment side, beside run_onnx.py, whose command line pygpt-run
hands to `main` here for an export whose runner.json says "family": "bert"). Rows are built
exactly as pygpt builds them: [CLS] text [SEP] for fill-mask (the text's "[MASK]"s are mask
tokens), and for a classifier [CLS] text [SEP] (text_pair [SEP]), the longer text cut from its
end until the row fits."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import numpy as np

from pygpt_runtime.cli_checks import check_threads, exits_cleanly, utf8_text
from pygpt_runtime.onnx_text import open_export, run_graph
from pygpt_runtime.run_onnx import parser

MASK = "[MASK]"


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """The lengths of A and B once the longer (B on a tie) has lost its last token until the
    two fit budget, as pygpt.data.common.truncate_pair."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


class OnnxBERT:
    """One onnxruntime session over an exported BERT folder."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        self.config, self.session, self.tokenizer = open_export(
            self.folder, variant, threads, "bert",
            "; fill-mask and classification need a bert export")
        self.task, self.labels = self.config["task"], self.config.get("labels")
        self.specials = self.tokenizer.special_tokens
        needed = ["[PAD]", "[CLS]", "[SEP]", *([MASK] if self.task == "fill-mask" else [])]
        missing = [name for name in needed if name not in self.specials]
        if missing:
            raise ValueError(f"{self.folder}: the tokenizer has no {', '.join(missing)}: "
                             "export again")

    def logits(self, rows: list[list[int]], firsts: Optional[list[int]] = None) -> np.ndarray:
        """The logits of token rows, right-padded into one batch; firsts[i]: where row i's
        segment B starts (None: no segment B)."""
        lengths = [len(r) for r in rows]
        ids = np.full((len(rows), max(lengths)), self.specials["[PAD]"], dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for b, row in enumerate(rows):
            ids[b, :len(row)], mask[b, :len(row)] = row, 1
            types[b, (firsts[b] if firsts else len(row)):len(row)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        logits = run_graph(self.session, feeds)[0]
        if self.labels is not None and logits.shape[-1] != len(self.labels):
            raise ValueError(f"{self.folder}: runner.json names {len(self.labels)} labels but "
                             f"the model gives {logits.shape[-1]} classes: export again")
        return logits

    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """For each [MASK] in text, in order, the top_k (token, probability) pairs."""
        if self.task != "fill-mask":
            raise ValueError(f"{self.folder} holds a classifier; it has no masked-LM head")
        sp = self.specials
        ids = [sp["[CLS]"], *self.tokenizer.encode(text, parse_specials=True), sp["[SEP]"]]
        if len(ids) > self.config["block_size"]:
            raise ValueError(f"the text is {len(ids)} tokens with [CLS] and [SEP]; the model "
                             f"takes at most {self.config['block_size']}")
        at = [i for i, t in enumerate(ids) if t == sp[MASK]]
        if not at:
            raise ValueError(f"the text has no {MASK} to fill")
        probs = softmax(self.logits([ids])[0, at])
        best = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
        return [[(self.tokenizer.decode([int(i)]), float(p[i])) for i in row]
                for p, row in zip(probs, best)]

    def classify(self, texts: list[str], pairs: Optional[list[str]] = None) -> np.ndarray:
        """The class probabilities (n, num_labels) of texts (with their pairs)."""
        if self.task != "classify":
            raise ValueError(f"{self.folder} holds a pretrained model without a classification "
                             "head; use --text with a [MASK] to fill")
        sp, block = self.specials, self.config["block_size"]
        rows, firsts = [], []
        for n, text in enumerate(texts):
            a = self.tokenizer.encode(text)
            if pairs is None:
                rows.append([sp["[CLS]"], *a[:block - 2], sp["[SEP]"]])
                firsts.append(len(rows[-1]))
            else:
                b = self.tokenizer.encode(pairs[n])
                len_a, len_b = truncate_pair(len(a), len(b), block - 3)
                rows.append([sp["[CLS]"], *a[:len_a], sp["[SEP]"], *b[:len_b], sp["[SEP]"]])
                firsts.append(len_a + 2)
        return softmax(self.logits(rows, firsts))


def main(argv: Optional[list[str]] = None) -> None:
    """pygpt-run for a bert export (run_onnx's command line)."""
    args = parser().parse_args(argv)
    with exits_cleanly():
        run_bert(args, "int8" if args.int8 else "fp32")


def run_bert(args: argparse.Namespace, variant: str) -> None:
    """Fills the masks of --text, or classifies --text (and --text-pair); prints as
    python -m pygpt.fill_mask / python -m pygpt.classify --text do."""
    try:
        if args.text is None:
            raise ValueError("a bert export takes --text (not --prompt)")
        check_threads(args.threads)
        for flag, text in (("--text", args.text), ("--text-pair", args.text_pair)):
            if text is not None:
                utf8_text(text, flag)
        model = OnnxBERT(args.model, variant, args.threads)
        if model.task == "fill-mask":
            if args.text_pair is not None:
                raise ValueError("--text-pair is for a classifier")
            top_k = 5 if args.top_k is None else args.top_k
            if top_k < 1:
                raise ValueError("--top-k must be at least 1")
            fills = model.fill_mask(args.text, top_k)
        else:
            if not args.text.strip() or (args.text_pair is not None and not args.text_pair.strip()):
                raise ValueError("--text and --text-pair must not be empty")
            pairs = None if args.text_pair is None else [args.text_pair]
            probs = model.classify([args.text], pairs)[0]
    except (ValueError, OSError, ImportError) as e:
        raise SystemExit(f"error: {e}") from None
    if model.task == "fill-mask":
        for n, candidates in enumerate(fills, start=1):
            shown = ", ".join(f"{token!r} {prob:.3f}" for token, prob in candidates)
            print(f"{MASK} {n}: {shown}")
    else:
        print(model.labels[int(probs.argmax())])
        for label, prob in sorted(zip(model.labels, probs.tolist()), key=lambda lp: -lp[1]):
            print(f"  {label}: {prob:.4f}")
