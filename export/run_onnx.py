"""Generate text from a pygpt model exported to ONNX, with onnxruntime and numpy only.

    python export/run_onnx.py --model out/onnx/ --prompt "ROMEO:" --max-new-tokens 500

This file is the deployment side: copy it with the export folder to a machine that has
`pip install -r export/requirements.txt` (no torch, no pygpt). It mirrors pygpt's generator:
the same KV-cache loop, the same sliding window (continue from the last half-context once the
context is full) and the same greedy / temperature / top-k / top-p rules, so greedy text matches
PyTorch's token for token.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import onnxruntime as ort

RUNNER_CONFIG = "runner.json"  # the export's config (pygpt.run_files names it; no pygpt here)


class CharTokenizer:
    """The character tokenizer of pygpt (tokenizer.json with kind 'char')."""

    def __init__(self, chars: list[str]):
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    def encode(self, text: str) -> list[int]:
        missing = list(dict.fromkeys(c for c in text if c not in self.index))
        if missing:
            raise ValueError(f"{len(missing)} character(s) not in the model's vocabulary: "
                             + " ".join(repr(c) for c in missing[:20]))
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class BPETokenizer:
    """A byte-level BPE tokenizer.json (HF format), through the `tokenizers` library."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer  # only models with a BPE tokenizer need the library

        self._tok = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids  # byte-level: every text encodes

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def load_tokenizer(path: Path, kind: str):
    if kind == "char":
        return CharTokenizer(json.loads(path.read_text(encoding="utf-8"))["chars"])
    if kind == "bpe":
        return BPETokenizer(path)
    raise ValueError(f"{path}: unsupported tokenizer kind {kind!r}")


def decode_stream(tokenizer, ids) -> Iterator[str]:
    """Text pieces as they become whole (a byte-level token can end inside a character)."""
    pending: list[int] = []
    for i in ids:
        pending.append(int(i))
        text = tokenizer.decode(pending)
        if not text.endswith("\ufffd"):
            yield text
            pending = []
    if pending:
        yield tokenizer.decode(pending)


class OnnxGPT:
    """One onnxruntime session over an exported folder, stepping with a KV cache."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        config_path = self.folder / RUNNER_CONFIG
        if not config_path.exists():
            raise FileNotFoundError(f"{self.folder} has no {RUNNER_CONFIG}: not a pygpt ONNX "
                                    "export (or one made before it was named so: export again)")
        self.config = json.loads(config_path.read_text(encoding="utf-8"))
        if variant not in self.config["models"]:
            raise ValueError(f"no {variant} model in {self.folder} "
                             f"(has: {', '.join(self.config['models'])})")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(self.folder / self.config["models"][variant]),
                                            options, providers=["CPUExecutionProvider"])
        self.tokenizer = load_tokenizer(self.folder / self.config["tokenizer"]["file"],
                                        self.config["tokenizer"]["kind"])
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
    p = argparse.ArgumentParser(description="Generate text from a pygpt ONNX export.")
    p.add_argument("--model", required=True, help="the export folder (runner.json, model.onnx)")
    p.add_argument("--int8", action="store_true", help="use the int8-quantized model")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    args = p.parse_args(argv)
    try:
        if not args.temperature > 0:
            raise ValueError("--temperature must be > 0")
        if not args.prompt:
            raise ValueError("--prompt must not be empty")
        model = OnnxGPT(args.model, "int8" if args.int8 else "fp32", args.threads)
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
