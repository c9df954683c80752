"""Run a pygpt model exported to ONNX, with onnxruntime and numpy only: generate text (gpt),
fill masks, classify, tag entities or answer questions (bert; see onnx_bert.py), by the family
its runner.json names.

    pygpt-run --model out/onnx/ --prompt "ROMEO:" --max-new-tokens 500
    pygpt-run --model out/onnx/ --prompt "ROMEO:" --prompt "JULIET:" --seed 1   # one batch
    pygpt-run --model bert/onnx/ --text "To be, or not to [MASK]" --top-k 5
    pygpt-run --model cls/onnx/ --text "a cat" [--text-pair "a dog"]
    pygpt-run --model ner/onnx/ --text "Peter Blackburn flew to Brussels"   # or --data FILE
    pygpt-run --model qa/onnx/ --question "Where?" --context "It rises in the Alps." [--no-answer]
    pygpt-run --model qa/onnx/ --data dev-v2.0.json                        # exact match, F1

(pygpt-run is `python -m pygpt_runtime`; it runs a translator's export with onnx_seq2seq.py's
flags.) This package is the deployment side: `pip install export/` on a machine without torch or
pygpt, and copy the export folder there. A bert's tasks print what python -m pygpt.fill_mask /
pygpt.classify / pygpt.tag (--text, --data) and pygpt.answer (--question, --data) print. For a
gpt it mirrors pygpt's generator: the same KV-cache loop, the same sliding window (continue from
the last half-context once the context is full) and the same greedy / temperature / top-k /
top-p rules, so greedy text matches PyTorch's token for token. Several prompts (--prompt again)
are decoded together in one batch, one graph call per step whatever their lengths (Rows), and
printed when done, each under a "=== prompt N ===" line as pygpt.generate prints them; each gets
the text it gets alone. It refuses the sampling values pygpt.generate refuses (cli_checks.py),
and Ctrl-C stops it with exit status 130 after the text so far.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from pygpt_runtime.cli_checks import (HelpFormatter, add_sampling_flags, check_sampling,
                                      check_threads, exits_cleanly, utf8_text)
from pygpt_runtime.onnx_text import open_export, run_graph
from pygpt_runtime.runner_config import past_heads, read_config, takes_lengths
from pygpt_runtime.text import decode_stream


class OnnxGPT:
    """One onnxruntime session over an exported folder, stepping with a KV cache. A graph of
    runner.json format 2 takes each row's lengths (`padded`: rows of different lengths run in one
    call, right-padded); one of format 1 does not (rows of one call hold the same lengths)."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        self.config, self.session, self.tokenizer = open_export(
            self.folder, variant, threads, "gpt", ", which does not generate")
        self.past_names = [n for n in self.config["inputs"] if n.startswith("past_key_values.")]
        self.padded = takes_lengths(self.config)

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """Each past input with no positions yet: its layer's heads (layer_heads where layers
        differ, else n_head) and the key or value width."""
        return [np.zeros((batch, past_heads(self.config, name), 0,
                          self.config["v_head_dim" if name.endswith(".value") else "head_dim"]),
                         dtype=np.float32)
                for name in self.past_names]

    def step(self, ids: np.ndarray, past: list[np.ndarray],
             input_lengths: Optional[np.ndarray] = None,
             past_lengths: Optional[np.ndarray] = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """ids (batch, seq) int64 after the cached positions -> logits (batch, seq, vocab),
        present. A padded graph also takes each row's real tokens of ids and real positions of
        past (right-padded; default: all of them), and row b's present then holds
        past_lengths[b] + input_lengths[b] real positions first."""
        feeds = {"input_ids": ids.astype(np.int64), **dict(zip(self.past_names, past))}
        if self.padded:
            batch = ids.shape[0]
            feeds["input_lengths"] = (np.full(batch, ids.shape[1], dtype=np.int64)
                                      if input_lengths is None else input_lengths.astype(np.int64))
            feeds["past_lengths"] = (np.full(batch, past[0].shape[2], dtype=np.int64)
                                     if past_lengths is None else past_lengths.astype(np.int64))
        elif input_lengths is not None or past_lengths is not None:
            raise ValueError("this export's graph (runner.json format 1) takes no lengths: "
                             "export again to run rows of different lengths together")
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


def window_key(model: OnnxGPT, window: Sequence[int]) -> int:
    """Which rows may decode together: any rows with a padded graph (0), else those of one
    window length (a format 1 graph takes no lengths)."""
    return 0 if model.padded else len(window)


class Rows:
    """Rows decoding together: each row's window (the tokens its next prediction sees) and a KV
    cache of each row's window but its newest token, right-padded. Each step slides a row's
    window past the context length as pygpt.decoding.sampling does: a window longer than the
    context restarts from its last window_keep tokens, re-prefilled. Only the windows are held (at
    most the context + 1 tokens each), so each token costs the same however long decoding runs.

    A step runs the graph at most twice: one prefill of the rows whose window (re)starts (new
    rows, right-padded into one batch) and one decode step of all the others, whatever their
    lengths; each row's logits are those it would get alone. A format 1 export's graph takes no
    lengths: its rows must share one window length (`key`: the server groups them so)."""

    def __init__(self, windows: Sequence[Sequence[int]]):
        self.windows = [[int(t) for t in w] for w in windows]
        self.past: Optional[list[np.ndarray]] = None  # (B, H, width, D): window[:-1] per row
        self.fresh = np.ones(len(self.windows), dtype=bool)  # rows whose cache is not that

    def __len__(self) -> int:
        return len(self.windows)

    def key(self, model: OnnxGPT) -> int:
        """Rows of one key may join (window_key of their first row)."""
        return window_key(model, self.windows[0])

    def logits(self, model: OnnxGPT) -> np.ndarray:
        """The next-token logits (batch, vocab) of every row."""
        block, keep = model.config["block_size"], model.config["window_keep"]
        for b, w in enumerate(self.windows):
            if len(w) > block:
                self.windows[b], self.fresh[b] = w[-keep:], True
        if not model.padded and len({len(w) for w in self.windows}) > 1:
            raise ValueError("this export's graph (runner.json format 1) runs rows of one length "
                             "together: export again to decode prompts of different lengths")
        lengths = np.array([len(w) for w in self.windows], dtype=np.int64)
        out: list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]] = []  # rows, logits, present
        start, going = np.flatnonzero(self.fresh), np.flatnonzero(~self.fresh)
        if len(start):
            ids = np.zeros((len(start), lengths[start].max()), dtype=np.int64)
            for n, b in enumerate(start):
                ids[n, :lengths[b]] = self.windows[b]
            given = (lengths[start], np.zeros(len(start), dtype=np.int64)) if model.padded else ()
            logits, present = model.step(ids, model.empty_past(len(start)), *given)
            out.append((start, logits[np.arange(len(start)), lengths[start] - 1], present))
        if len(going):
            held = lengths[going] - 1  # each row's cached positions
            past = self.past if len(going) == len(self) else [t[going] for t in self.past]
            ids = np.array([[self.windows[b][-1]] for b in going], dtype=np.int64)
            if model.padded:
                past = [t[:, :, :held.max()] for t in past]
                logits, present = model.step(ids, past, np.ones(len(going), np.int64), held)
            else:
                logits, present = model.step(ids, past)
            out.append((going, logits[:, -1], present))
        self.fresh[:] = False
        if len(out) == 1:  # all the rows, in order
            _, logits, self.past = out[0]
        else:
            logits, self.past = _placed(out, len(self))
        return logits

    def append(self, tokens: np.ndarray) -> None:
        """Adds each row's chosen token (batch,) after logits."""
        for w, t in zip(self.windows, tokens.tolist()):
            w.append(int(t))

    def take(self, rows: list[int]) -> "Rows":
        """These rows alone, in this order."""
        index = np.array(rows, dtype=np.int64)
        taken = Rows([self.windows[b] for b in rows])
        taken.past = None if self.past is None else [t[index] for t in self.past]
        taken.fresh = self.fresh[index]
        return taken

    def join(self, other: "Rows") -> "Rows":
        """self's rows then other's, both run already (their caches right-padded to one
        width)."""
        if self.past is None or other.past is None:
            raise ValueError("only rows run already join")
        joined = Rows(self.windows + other.windows)
        joined.past = [_padded_cat([a, b]) for a, b in zip(self.past, other.past)]
        joined.fresh = np.concatenate([self.fresh, other.fresh])
        return joined


def _padded_cat(parts: list[np.ndarray]) -> np.ndarray:
    """Caches (B_i, H, width_i, D) stacked by rows, each right-padded with zeros to the widest."""
    width = max(p.shape[2] for p in parts)
    return np.concatenate([np.pad(p, ((0, 0), (0, 0), (0, width - p.shape[2]), (0, 0)))
                           for p in parts])


def _placed(out: list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]],
            batch: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The logits and caches of the graph calls of a step, each row back in its place."""
    order = np.argsort(np.concatenate([rows for rows, _, _ in out]))
    logits = np.concatenate([lg for _, lg, _ in out])[order]
    past = [_padded_cat([present[i] for _, _, present in out])[order]
            for i in range(len(out[0][2]))]
    return logits, past


def stream(model: OnnxGPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
           rng: Union[None, np.random.Generator, Sequence[np.random.Generator]] = None,
           **sampling) -> Iterator[np.ndarray]:
    """Yields max_new_tokens new tokens (batch,) continuing each prompt (rows of token ids, of
    any lengths with a format 2 export; see Rows); rng: one generator for every row (drawn from
    row by row), or one per row (each row then draws what it would alone)."""
    rows = Rows([list(p)[-model.config["block_size"]:] for p in prompts])
    for _ in range(max_new_tokens):
        logits = rows.logits(model)
        if rng is None or isinstance(rng, np.random.Generator):
            nxt = next_token(logits, rng=rng, **sampling)
        else:
            nxt = np.array([next_token(logits[b:b + 1], rng=g, **sampling)[0]
                            for b, g in enumerate(rng)])
        rows.append(nxt)
        yield nxt


def parser() -> argparse.ArgumentParser:
    """pygpt-run's command line for the families of one graph: a gpt's (main) and a bert's
    (onnx_bert.main); its --help is this module's docstring."""
    p = argparse.ArgumentParser(prog="pygpt-run", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True,
                   help="the export folder: runner.json, model.onnx (required)")
    p.add_argument("--int8", action="store_true", help="use the int8-quantized model")
    p.add_argument("--prompt", action="append", default=None,
                   help="gpt: the text to continue (default: a newline); give it again for more "
                        "prompts, decoded together")
    p.add_argument("--text", default=None, help="bert: a text with [MASK]s to fill, or a text "
                                                "to classify or tag (default: none)")
    p.add_argument("--text-pair", default=None,
                   help="bert classifier: the second text (default: none)")
    p.add_argument("--data", default=None,
                   help="bert entity tagger: a CoNLL file to score it on (entity precision, "
                        "recall and F1); question answerer: a SQuAD v1.1 or v2.0 file (exact "
                        "match and F1)")
    p.add_argument("--question", default=None,
                   help="bert question answerer: a question to answer from --context")
    p.add_argument("--context", default=None, help="bert question answerer: the text that "
                                                   "holds the answer")
    p.add_argument("--no-answer", action="store_true",
                   help="bert question answerer: the question may go unanswered (SQuAD v2.0): "
                        "when the [CLS] score beats the best span's by more than "
                        "--null-threshold")
    p.add_argument("--null-threshold", type=float, default=0.0,
                   help="bert question answerer: how far the [CLS] score must beat the best "
                        "span's for no answer")
    add_sampling_flags(p, "gpt: ", top_k_also="; bert fill-mask: fills shown (default: 5)")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime intra-op threads (default: onnxruntime's choice)")
    return p


def main(argv: Optional[list[str]] = None) -> None:
    """pygpt-run for a gpt export: generates from each --prompt."""
    args = parser().parse_args(argv)
    variant = "int8" if args.int8 else "fp32"
    try:
        check_threads(args.threads)
        read_config(Path(args.model), "gpt", ", which does not generate")
        if any(v is not None for v in (args.text, args.text_pair, args.data, args.question,
                                       args.context)):
            raise ValueError(f"--text and --question are for a bert export; {args.model} holds "
                             "a gpt model (give --prompt)")
        prompts = ["\n"] if args.prompt is None else args.prompt
        check_sampling(args.greedy, args.temperature, args.top_k, args.top_p,
                       args.max_new_tokens)
        for text in prompts:
            if not text:
                raise ValueError("--prompt must not be empty")
            utf8_text(text, "--prompt")
        model = OnnxGPT(args.model, variant, args.threads)
        ids = [encoded(model.tokenizer, text, i, len(prompts)) for i, text in enumerate(prompts)]
    except (ValueError, OSError, ImportError) as e:
        raise SystemExit(f"error: {e}") from None
    sampling = dict(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p)
    with exits_cleanly():
        try:
            if len(prompts) > 1:
                write_batch(model, prompts, ids, args.max_new_tokens, args.seed, sampling)
            else:
                write_stream(model, prompts[0], ids[0], args.max_new_tokens, args.seed, sampling)
        except ValueError as e:  # outputs that are not finite numbers
            sys.stdout.flush()
            raise SystemExit(f"error: {e}") from None


def encoded(tokenizer, text: str, i: int, n: int) -> list[int]:
    """The prompt's token ids; an error naming the prompt (when there are several)."""
    try:
        return tokenizer.encode(text)
    except ValueError as e:
        raise ValueError(f"prompt {i + 1}: {e}" if n > 1 else str(e)) from None


def write_stream(model: OnnxGPT, prompt: str, ids: list[int], max_new_tokens: int,
                 seed: Optional[int], sampling: dict) -> None:
    """Prints the prompt and its continuation as it is sampled."""
    sys.stdout.write(prompt)
    tokens = stream(model, [ids], max_new_tokens, rng=np.random.default_rng(seed), **sampling)
    for piece in decode_stream(model.tokenizer, (int(t[0]) for t in tokens)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def write_batch(model: OnnxGPT, prompts: list[str], ids: list[list[int]], max_new_tokens: int,
                seed: Optional[int], sampling: dict) -> None:
    """Decodes the prompts together (each row with its own generator of the seed, so each
    samples what it would alone), then prints each one's text under a "=== prompt N ===" line,
    as python -m pygpt.generate does (on Ctrl-C or an error, the text so far)."""
    new: list[list[int]] = [[] for _ in prompts]
    rngs = [np.random.default_rng(seed) for _ in prompts]
    try:
        for step in stream(model, ids, max_new_tokens, rng=rngs, **sampling):
            for row, t in zip(new, step.tolist()):
                row.append(t)
    finally:
        for i, (text, row) in enumerate(zip(prompts, new)):
            continuation = "".join(decode_stream(model.tokenizer, row))
            sys.stdout.write(f"=== prompt {i + 1} ===\n{text}{continuation}\n")
        sys.stdout.flush()
