"""How much an ONNX export (fp32 and int8) changes the model: val loss on the shipped text's
validation split for PyTorch, onnxruntime fp32 and onnxruntime int8 (the same fixed windows for
all three), and how many of the first N greedy tokens the int8 model shares with fp32.

    python -m pygpt.train --out out && python -m pygpt.export --ckpt out --quantize int8
    python benchmarks/eval_onnx.py --ckpt out --onnx out/onnx
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import pygpt
from pygpt.data.text import TokenSplits, read_text
from pygpt.decoding.sampling import Sampling
from pygpt_runtime import run_onnx


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    z = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-log_probs[np.arange(len(z)), targets.reshape(-1)].mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", default="out")
    p.add_argument("--onnx", default=None, help="export folder (default: <ckpt>/onnx)")
    p.add_argument("--batches", type=int, default=40, help="val batches of --batch-size windows")
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--greedy-tokens", type=int, default=200)
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    onnx_dir = args.onnx or str(Path(args.ckpt) / "onnx")
    model, tokenizer = pygpt.load(args.ckpt)
    sessions = {name: run_onnx.OnnxGPT(onnx_dir, name, args.threads) for name in ("fp32", "int8")}
    tokens = torch.tensor(tokenizer.encode(read_text(None)), dtype=torch.long)
    splits = TokenSplits(tokens, model.config.block_size)
    gen = torch.Generator().manual_seed(0)
    losses = {"pytorch": [], "fp32": [], "int8": []}
    for _ in range(args.batches):
        x, y = splits.batch("val", args.batch_size, gen)
        with torch.no_grad():
            losses["pytorch"].append(model(x, y).loss.item())
        for name, session in sessions.items():
            logits, _ = session.step(x.numpy(), session.empty_past(x.shape[0]))
            losses[name].append(cross_entropy(logits, y.numpy()))
    for name, values in losses.items():
        print(f"val loss {name:8s} {np.mean(values):.4f}")

    prompt = tokenizer.encode(args.prompt)
    greedy = {name: [int(t[0]) for t in run_onnx.stream(s, np.array([prompt]), args.greedy_tokens,
                                                       greedy=True)]
              for name, s in sessions.items()}
    torch_greedy = model.generate(torch.tensor([prompt]), args.greedy_tokens,
                                  sampling=Sampling(greedy=True))[0, len(prompt):].tolist()
    same_prefix = next((i for i, (a, b) in enumerate(zip(greedy["fp32"], greedy["int8"])) if a != b),
                       args.greedy_tokens)
    matches = sum(a == b for a, b in zip(greedy["fp32"], greedy["int8"]))
    print(f"greedy fp32 == pytorch for all {args.greedy_tokens} tokens: "
          f"{greedy['fp32'] == torch_greedy}")
    print(f"greedy int8 vs fp32: {matches}/{args.greedy_tokens} positions equal, "
          f"identical for the first {same_prefix}")
    print("int8 text:", repr(tokenizer.decode(greedy["int8"])[:120]))


if __name__ == "__main__":
    main()
