"""Run a pygpt model exported to ONNX, with onnxruntime and numpy only: generate text (gpt),
fill masks or classify (bert; see onnx_bert.py), by the family its runner.json names.

    python export/run_onnx.py --model out/onnx/ --prompt "ROMEO:" --max-new-tokens 500
    python export/run_onnx.py --model bert/onnx/ --text "To be, or not to [MASK]" --top-k 5
    python export/run_onnx.py --model cls/onnx/ --text "a cat" [--text-pair "a dog"]

This folder is the deployment side: copy run_onnx.py, onnx_text.py and onnx_bert.py with the
export folder to a machine that has `pip install -r export/requirements.txt` (no torch, no
pygpt). Fill-mask and classify print what python -m pygpt.fill_mask / pygpt.classify --text
print. For a gpt it mirrors pygpt's generator:
the same KV-cache loop, the same sliding window (continue from the last half-context once the
context is full) and the same greedy / temperature / top-k / top-p rules, so greedy text matches
PyTorch's token for token.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

if str(Path(__file__).resolve().parent) not in sys.path:  # its siblings, however it is loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_bert import OnnxBERT, run_bert  # noqa: E402,F401  (OnnxBERT: for callers)
from onnx_text import (RUNNER_CONFIG, decode_stream, open_export,  # noqa: E402,F401
                       read_config)


class OnnxGPT:
    """One onnxruntime session over an exported folder, stepping with a KV cache."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        self.config, self.session, self.tokenizer = open_export(self.folder, variant, threads)
        if self.config.get("family", "gpt") != "gpt":
            raise ValueError(f"{self.folder} holds a {self.config['family']} model, which does "
                             "not generate")
        self.past_names = self.config["inputs"][1:]

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.config["n_head"], 0, self.config["head_dim"])
        return [np.zeros(shape, dtype=np.float32) for _ in self.past_names]

    def step(self, ids: np.ndarray, past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """ids (batch, seq) int64 after the cached positions -> logits (batch, seq, vocab), present."""
        feeds = {"input_ids": ids.astype(np.int64), **dict(zip(self.past_names, past))}
        logits, *present = self.session.run(None, feeds)
        return logits, present


def next_token(logits: np.ndarray, greedy: bool = False, temperature: float = 1.0,
               top_k: Optional[int] = None, top_p: Optional[float] = None,
               rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """logits (batch, vocab) -> token ids (batch,); pygpt.decoding.next_token's rules."""
    if greedy:
        return logits.argmax(axis=-1)
    rng = rng or np.random.default_rng()
    z = logits.astype(np.float64) / temperature
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


def stream(model: OnnxGPT, ids: np.ndarray, max_new_tokens: int, **sampling) -> Iterator[np.ndarray]:
    """Yields max_new_tokens new tokens (batch,) continuing ids (batch, T); the window slides
    past the context length as pygpt.decoding does."""
    block, keep = model.config["block_size"], model.config["window_keep"]
    tokens = ids
    start = max(0, tokens.shape[1] - block)
    past = None
    for _ in range(max_new_tokens):
        length = tokens.shape[1]
        if length - start > block:
            start, past = length - keep, None
        if past is None:
            logits, past = model.step(tokens[:, start:], model.empty_past(tokens.shape[0]))
        else:
            logits, past = model.step(tokens[:, -1:], past)
        nxt = next_token(logits[:, -1], **sampling)
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        yield nxt


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description="Run a pygpt ONNX export: generate text (gpt), "
                                "fill masks or classify (bert).")
    p.add_argument("--model", required=True, help="the export folder (runner.json, model.onnx)")
    p.add_argument("--int8", action="store_true", help="use the int8-quantized model")
    p.add_argument("--prompt", default=None, help="gpt: the text to continue (default: a newline)")
    p.add_argument("--text", default=None, help="bert: a text with [MASK]s to fill, or a text "
                                                "to classify")
    p.add_argument("--text-pair", default=None, help="bert classifier: the second text")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None,
                   help="gpt: sample from the k likeliest; bert fill-mask: fills shown (5)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    args = p.parse_args(argv)
    variant = "int8" if args.int8 else "fp32"
    try:
        family = read_config(Path(args.model))["family"]
        if family == "bert":
            return run_bert(args, variant)
        if args.text is not None or args.text_pair is not None:
            raise ValueError(f"--text is for a bert export; {args.model} holds a {family} model "
                             "(give --prompt)")
        args.prompt = "\n" if args.prompt is None else args.prompt
        if not args.temperature > 0:
            raise ValueError("--temperature must be > 0")
        if not args.prompt:
            raise ValueError("--prompt must not be empty")
        model = OnnxGPT(args.model, variant, args.threads)
        ids = np.array([model.tokenizer.encode(args.prompt)], dtype=np.int64)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    rng = np.random.default_rng(args.seed)
    sys.stdout.write(args.prompt)
    tokens = stream(model, ids, args.max_new_tokens, greedy=args.greedy,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, rng=rng)
    for piece in decode_stream(model.tokenizer, (int(t[0]) for t in tokens)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
