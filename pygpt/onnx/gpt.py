"""The GPT's ONNX export: one self-contained `model.onnx` with a KV cache, in the convention
onnxruntime-genai and Optimum use: inputs `input_ids` (batch, seq) and
`past_key_values.{i}.key` / `.value` (batch, heads, past, head_dim); outputs `logits`
(batch, seq, vocab) and `present.{i}.key` / `.value` (batch, heads, past + seq, head_dim). Batch,
sequence and past length are dynamic; a past of length 0 is the prefill. Each layer's past has
that layer's heads: n_head, or, where layers differ (a globally pruned model),
runner.json's `layer_heads` (written only then, so that uniform exports read as before).

Rows of different lengths run in one call: `input_lengths` (batch,) int64 are each row's real
tokens of a right-padded input_ids, `past_lengths` (batch,) int64 each row's real positions of a
right-padded past (pygpt.onnx.padded_past). Row b's tokens are at positions past_lengths[b] ..,
for every position encoding (tables and rotary angles per row, relative / ALiBi distances per
row), and its present holds its past_lengths[b] + input_lengths[b] real positions first, then
padding; the logits of padded positions mean nothing. runner.json says format 2 for such a graph
(format 1: exports made before, without the lengths, whose positions come from the past's
width; pygpt_runtime still runs them). Beside it: `tokenizer.json`, and `runner.json` with what
the runner needs (pygpt.onnx.graph.write_export). The export is checked against PyTorch (a
right-padded prefill and a decode step of rows at different positions) before anything is
written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from pygpt.config import ModelConfig
from pygpt.decoding.sampling import window_keep
from pygpt.models import GPT
from pygpt.onnx.graph import models_entry, to_onnx, write_export
from pygpt.onnx.int8 import Int8Settings
from pygpt.onnx.padded_past import PaddedPast
from pygpt.storage.run_files import ONNX_FP32

Past = list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (keys, values)


RUNNER_FORMAT = 2  # runner.json's format for a graph with the length inputs


class _CachedStep(torch.nn.Module):
    """The model as the exported graph sees it: right-padded ids, the rows' lengths and a
    right-padded past in, logits and present out."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, input_lengths: torch.Tensor,
                past_lengths: torch.Tensor, past: Past):
        cache = PaddedPast(past, past_lengths)
        return self.model(input_ids, cache=cache, lengths=input_lengths).logits, cache.tensors()


def io_names(n_layer: int) -> tuple[list[str], list[str]]:
    kv = [(i, name) for i in range(n_layer) for name in ("key", "value")]
    return (["input_ids", "input_lengths", "past_lengths"]
            + [f"past_key_values.{i}.{name}" for i, name in kv],
            ["logits"] + [f"present.{i}.{name}" for i, name in kv])


def _past(cfg: ModelConfig, batch: int, length: int) -> Past:
    """Zero keys and values of `length` positions, each layer with its own heads."""
    return [(torch.zeros(batch, cfg.heads(i), length, cfg.qk_head_dim),
             torch.zeros(batch, cfg.heads(i), length, cfg.v_head_dim)) for i in range(cfg.n_layer)]


def empty_past(model: GPT, batch: int) -> Past:
    return _past(model.config, batch, 0)


def _to_onnx(model: GPT, path: Path) -> None:
    from torch.export import Dim

    cfg = model.config
    batch = Dim("batch", min=1, max=4096)
    seq = Dim("seq", min=1, max=cfg.block_size)
    past_len = Dim("past", min=0, max=cfg.block_size)
    # Example inputs with distinct sizes so no dimension gets specialised to a constant.
    ids = torch.zeros(2, 3, dtype=torch.long)
    input_lengths, past_lengths = torch.tensor([3, 2]), torch.tensor([4, 1])
    past = _past(cfg, 2, 4)
    dynamic = {"input_ids": {0: batch, 1: seq}, "input_lengths": {0: batch},
               "past_lengths": {0: batch},
               "past": [({0: batch, 2: past_len}, {0: batch, 2: past_len})] * cfg.n_layer}
    inputs, outputs = io_names(cfg.n_layer)
    to_onnx(_CachedStep(model), (ids, input_lengths, past_lengths, past), path, inputs, outputs,
            dynamic, cfg.block_size)


def _check_against_torch(model: GPT, path: Path, tol: float = 1e-4) -> None:
    """A right-padded prefill of two rows of different lengths, then a decode step of the rows
    at their different positions, in onnxruntime must match PyTorch's (prefill with lengths,
    then step on its KV cache) on every real position, or the export fails."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past_names = io_names(model.config.n_layer)[0][3:]
    n = min(5, model.config.block_size)
    lengths = torch.tensor([n, max(1, n - 2)])
    ids = torch.randint(model.config.vocab_size, (2, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, cache = model.prefill(ids, lengths)
    past = [t.numpy() for kv in empty_past(model, 2) for t in kv]
    past_lengths = torch.zeros(2, dtype=torch.long)
    for _ in range(2 if n < model.config.block_size else 1):
        feeds = {"input_ids": ids.numpy(), "input_lengths": lengths.numpy(),
                 "past_lengths": past_lengths.numpy(), **dict(zip(past_names, past))}
        logits, *past = session.run(None, feeds)
        real = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        err = float(np.abs(logits[real.numpy()] - expected[real].numpy()).max())
        if not err <= tol:
            raise RuntimeError(f"exported model disagrees with PyTorch: max logit error {err:.3g}")
        past_lengths = past_lengths + lengths
        ids = expected[torch.arange(2), lengths - 1].argmax(-1)[:, None]
        lengths = torch.ones(2, dtype=torch.long)
        with torch.no_grad():
            expected = model.step(ids, cache)


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
                     # Each layer's heads where they differ (n_head: the most of any layer).
                     **({"layer_heads": list(cfg.layer_heads)} if cfg.layer_heads else {}),
                     "inputs": io_names(cfg.n_layer)[0], "outputs": io_names(cfg.n_layer)[1],
                     "format": RUNNER_FORMAT}
    return write_export(Path(out_dir), {ONNX_FP32: lambda path: _to_onnx(model, path)},
                        lambda folder: _check_against_torch(model, folder / ONNX_FP32),
                        quantize, tokenizer,
                        {**runner_config, "models": models_entry(ONNX_FP32, quantize)})
