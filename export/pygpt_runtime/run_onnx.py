"""Run a pygpt model exported to ONNX, with onnxruntime and numpy only: generate text (gpt),
fill masks or classify (bert; see onnx_bert.py), by the family its runner.json names.

    pygpt-run --model out/onnx/ --prompt "ROMEO:" --max-new-tokens 500
    pygpt-run --model bert/onnx/ --text "To be, or not to [MASK]" --top-k 5
    pygpt-run --model cls/onnx/ --text "a cat" [--text-pair "a dog"]

(pygpt-run is `python -m pygpt_runtime`; it runs a translator's export with onnx_translate.py's
flags.) This package is the deployment side: `pip install export/` on a machine without torch or
pygpt, and copy the export folder there. Fill-mask and classify print what
python -m pygpt.fill_mask / pygpt.classify --text print. For a gpt it mirrors pygpt's generator:
the same KV-cache loop, the same sliding window (continue from the last half-context once the
context is full) and the same greedy / temperature / top-k / top-p rules, so greedy text matches
PyTorch's token for token. It refuses the sampling values pygpt.generate refuses
(cli_checks.py), and Ctrl-C stops it with exit status 130 after the text so far.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from pygpt_runtime.cli_checks import (HelpFormatter, add_sampling_flags, check_sampling,
                                      check_threads, exits_cleanly, utf8_text)
from pygpt_runtime.onnx_bert import OnnxBERT, run_bert  # noqa: F401  (OnnxBERT: for callers)
from pygpt_runtime.onnx_text import decode_stream, open_export, run_graph
from pygpt_runtime.runner_config import RUNNER_CONFIG, read_config  # noqa: F401


class OnnxGPT:
    """One onnxruntime session over an exported folder, stepping with a KV cache."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        self.config, self.session, self.tokenizer = open_export(
            self.folder, variant, threads, "gpt", ", which does not generate")
        self.past_names = self.config["inputs"][1:]

    def empty_past(self, batch: int) -> list[np.ndarray]:
        heads = (batch, self.config["n_head"], 0)
        return [np.zeros((*heads, self.config["v_head_dim" if name.endswith(".value")
                                              else "head_dim"]), dtype=np.float32)
                for name in self.past_names]

    def step(self, ids: np.ndarray, past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """ids (batch, seq) int64 after the cached positions -> logits (batch, seq, vocab), present."""
        feeds = {"input_ids": ids.astype(np.int64), **dict(zip(self.past_names, past))}
        logits, *present = run_graph(self.session, feeds)
        return logits, present


def next_token(logits: np.ndarray, greedy: bool = False, temperature: float = 1.0,
               top_k: Optional[int] = None, top_p: Optional[float] = None,
               rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """logits (batch, vocab) -> token ids (batch,); pygpt.decoding.sampling.next_token's rules, so any
    positive temperature works (a tiny one approaches greedy)."""
    if greedy:
        return logits.argmax(axis=-1)
    rng = rng or np.random.default_rng()
    z = logits.astype(np.float64)
    with np.errstate(over="ignore"):  # to -inf, as intended, below a tiny temperature
        z = (z - z.max(axis=-1, keepdims=True)) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    if top_p is not None and top_p < 1:
        order = np.argsort(-z, axis=-1)
        sorted_z = np.take_along_axis(z, order, axis=-1)
        p = np.exp(sorted_z - sorted_z[:, :1])
        p /= p.sum(axis=-1, keepdims=True)
        drop_sorted = (np.cumsum(p, axis=-1) - p) >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        z = np.where(drop, -np.inf, z)
    probs = np.exp(z - z.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in probs])


class Rows:
    """Rows decoding together: the tokens the next prediction sees (batch, L), one length for
    all, and the KV cache of all but the newest (None: not run yet). Each step slides the window
    past the context length as pygpt.decoding.sampling does: only the window is held (at most the
    context + 1 tokens), so each token costs the same however long decoding runs. Rows of one
    window length run in one graph call whatever their history (the server batches so), and
    each row's logits are those it would get alone."""

    def __init__(self, window: np.ndarray, past: Optional[list[np.ndarray]] = None):
        self.window, self.past = window, past

    def __len__(self) -> int:
        return self.window.shape[0]

    @property
    def length(self) -> int:
        return self.window.shape[1]

    def logits(self, model: OnnxGPT) -> np.ndarray:
        """The next-token logits (batch, vocab) of every row; runs the model once."""
        if self.length > model.config["block_size"]:
            self.window, self.past = self.window[:, -model.config["window_keep"]:], None
        if self.past is None:
            logits, self.past = model.step(self.window, model.empty_past(len(self)))
        else:
            logits, self.past = model.step(self.window[:, -1:], self.past)
        return logits[:, -1]

    def append(self, tokens: np.ndarray) -> None:
        """Adds each row's chosen token (batch,) after logits."""
        self.window = np.concatenate([self.window, tokens[:, None]], axis=1)

    def take(self, rows: list[int]) -> "Rows":
        """These rows alone, in this order."""
        index = np.array(rows, dtype=np.int64)
        past = None if self.past is None else [t[index] for t in self.past]
        return Rows(self.window[index], past)

    def join(self, other: "Rows") -> "Rows":
        """self's rows then other's, of the same window length, both run already."""
        if self.length != other.length or self.past is None or other.past is None:
            raise ValueError("only rows of one window length, run already, join")
        return Rows(np.concatenate([self.window, other.window]),
                    [np.concatenate(pair) for pair in zip(self.past, other.past)])


def stream(model: OnnxGPT, ids: np.ndarray, max_new_tokens: int, **sampling) -> Iterator[np.ndarray]:
    """Yields max_new_tokens new tokens (batch,) continuing ids (batch, T) (see Rows)."""
    rows = Rows(ids[:, -model.config["block_size"]:])
    for _ in range(max_new_tokens):
        nxt = next_token(rows.logits(model), **sampling)
        rows.append(nxt)
        yield nxt


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="pygpt-run", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True,
                   help="the export folder: runner.json, model.onnx (required)")
    p.add_argument("--int8", action="store_true", help="use the int8-quantized model")
    p.add_argument("--prompt", default=None, help="gpt: the text to continue (default: a newline)")
    p.add_argument("--text", default=None, help="bert: a text with [MASK]s to fill, or a text "
                                                "to classify (default: none)")
    p.add_argument("--text-pair", default=None,
                   help="bert classifier: the second text (default: none)")
    add_sampling_flags(p, "gpt: ", top_k_also="; bert fill-mask: fills shown (default: 5)")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime intra-op threads (default: onnxruntime's choice)")
    args = p.parse_args(argv)
    variant = "int8" if args.int8 else "fp32"
    try:
        check_threads(args.threads)
        family = read_config(Path(args.model))["family"]
        if family == "bert":
            with exits_cleanly():
                return run_bert(args, variant)
        if args.text is not None or args.text_pair is not None:
            raise ValueError(f"--text is for a bert export; {args.model} holds a {family} model "
                             "(give --prompt)")
        args.prompt = "\n" if args.prompt is None else args.prompt
        check_sampling(args.greedy, args.temperature, args.top_k, args.top_p,
                       args.max_new_tokens)
        if not args.prompt:
            raise ValueError("--prompt must not be empty")
        utf8_text(args.prompt, "--prompt")
        model = OnnxGPT(args.model, variant, args.threads)
        ids = np.array([model.tokenizer.encode(args.prompt)], dtype=np.int64)
    except (ValueError, OSError, ImportError) as e:
        raise SystemExit(f"error: {e}") from None
    rng = np.random.default_rng(args.seed)
    with exits_cleanly():
        sys.stdout.write(args.prompt)
        tokens = stream(model, ids, args.max_new_tokens, greedy=args.greedy,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, rng=rng)
        try:
            for piece in decode_stream(model.tokenizer, (int(t[0]) for t in tokens)):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except ValueError as e:  # outputs that are not finite numbers
            sys.stdout.flush()
            raise SystemExit(f"error: {e}") from None
        sys.stdout.write("\n")
        sys.stdout.flush()

