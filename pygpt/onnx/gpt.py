"""The GPT's ONNX export: one self-contained `model.onnx` with a KV cache, in the convention
onnxruntime-genai and Optimum use: inputs `input_ids` (batch, seq) and
`past_key_values.{i}.key` / `.value` (batch, heads, past, head_dim); outputs `logits`
(batch, seq, vocab) and `present.{i}.key` / `.value` (batch, heads, past + seq, head_dim). Batch,
sequence and past length are dynamic; a past of length 0 is the prefill, and positions are
derived from the past length, so a decode step at any offset is right. Beside it:
`tokenizer.json`, and `runner.json` with what the runner needs (pygpt.onnx.graph.write_export).
The export is checked against PyTorch (a prefill and a decode step) before anything is written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from pygpt.decoding.sampling import window_keep
from pygpt.models import GPT
from pygpt.nn import KVCache
from pygpt.onnx.graph import models_entry, to_onnx, write_export
from pygpt.onnx.int8 import Int8Settings
from pygpt.run_files import ONNX_FP32

Past = list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (keys, values)


class _CachedStep(torch.nn.Module):
    """The model as the exported graph sees it: ids and a past in, logits and present out."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, past: Past):
        cache = KVCache.from_tensors(past)
        return self.model(input_ids, cache=cache).logits, cache.tensors()


def io_names(n_layer: int) -> tuple[list[str], list[str]]:
    kv = [(i, name) for i in range(n_layer) for name in ("key", "value")]
    return (["input_ids"] + [f"past_key_values.{i}.{name}" for i, name in kv],
            ["logits"] + [f"present.{i}.{name}" for i, name in kv])


def empty_past(model: GPT, batch: int) -> Past:
    cfg = model.config
    return [(torch.zeros(batch, cfg.n_head, 0, cfg.qk_head_dim),
             torch.zeros(batch, cfg.n_head, 0, cfg.v_head_dim)) for _ in range(cfg.n_layer)]


def _to_onnx(model: GPT, path: Path) -> None:
    from torch.export import Dim

    cfg = model.config
    batch = Dim("batch", min=1, max=4096)
    seq = Dim("seq", min=1, max=cfg.block_size)
    past_len = Dim("past", min=0, max=cfg.block_size)
    # Example inputs with distinct sizes so no dimension gets specialised to a constant.
    ids = torch.zeros(2, 3, dtype=torch.long)
    past = [(torch.zeros(2, cfg.n_head, 4, cfg.qk_head_dim),
             torch.zeros(2, cfg.n_head, 4, cfg.v_head_dim)) for _ in range(cfg.n_layer)]
    dynamic = {"input_ids": {0: batch, 1: seq},
               "past": [({0: batch, 2: past_len}, {0: batch, 2: past_len})] * cfg.n_layer}
    inputs, outputs = io_names(cfg.n_layer)
    to_onnx(_CachedStep(model), (ids, past), path, inputs, outputs, dynamic)


def _check_against_torch(model: GPT, path: Path, tol: float = 1e-4) -> None:
    """Prefill and one decode step in onnxruntime must match PyTorch, or the export fails."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs, _ = io_names(model.config.n_layer)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (2, min(5, model.config.block_size)), generator=gen)
    past = empty_past(model, 2)
    for _ in range(2 if ids.shape[1] < model.config.block_size else 1):
        feeds = {"input_ids": ids.numpy()}
        feeds.update({name: t.numpy() for name, t in zip(inputs[1:], [t for kv in past for t in kv])})
        cache = KVCache.from_tensors(past)
        with torch.no_grad():
            expected = model(ids, cache=cache).logits
        got = session.run(None, feeds)
        err = float(np.abs(got[0] - expected.numpy()).max())
        if not err <= tol:
            raise RuntimeError(f"exported model disagrees with PyTorch: max logit error {err:.3g}")
        ids, past = ids[:, -1:], cache.tensors()


def export_gpt(model: GPT, tokenizer, out_dir: Path,
               quantize: Optional[Int8Settings] = None) -> list[Path]:
    """Exports a loaded GPT with its tokenizer into out_dir (with quantize, its int8 copy too);
    returns the files written."""
    cfg = model.config
    runner_config = {"family": "gpt", "task": "generate", "vocab_size": cfg.vocab_size,
                     "block_size": cfg.block_size, "window_keep": window_keep(cfg.block_size),
                     "n_layer": cfg.n_layer, "n_head": cfg.n_head, "head_dim": cfg.qk_head_dim,
                     # Values as wide as keys (head_dim) unless said otherwise.
                     **({"v_head_dim": cfg.v_head_dim} if cfg.v_head_dim != cfg.qk_head_dim
                        else {}),
                     "inputs": io_names(cfg.n_layer)[0], "outputs": io_names(cfg.n_layer)[1]}
    return write_export(Path(out_dir), {ONNX_FP32: lambda path: _to_onnx(model, path)},
                        lambda folder: _check_against_torch(model, folder / ONNX_FP32),
                        quantize, tokenizer,
                        {**runner_config, "models": models_entry(ONNX_FP32, quantize)})
