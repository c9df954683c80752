"""Export a checkpoint to ONNX: `python -m pygpt.export --ckpt out/ --out out/onnx/`.

Writes one self-contained `model.onnx` with a KV cache, in the convention onnxruntime-genai and
Optimum use: inputs `input_ids` (batch, seq) and `past_key_values.{i}.key` / `.value`
(batch, heads, past, head_dim); outputs `logits` (batch, seq, vocab) and `present.{i}.key` /
`.value` (batch, heads, past + seq, head_dim). Batch, sequence and past length are dynamic; a past
of length 0 is the prefill, and positions are derived from the past length, so a decode step at
any offset is right. Beside it: `tokenizer.json`, and `runner.json` with what the runner needs.
`--quantize int8` also writes `model.int8.onnx` (weights quantized by onnxruntime's own tooling).

pygpt's custom ops are translated to standard ONNX ops (attention into MatMul/Softmax with the
bottom-right causal mask, layer norm into LayerNormalization), so the graph runs in stock
onnxruntime with no custom-op library. The export is checked against PyTorch before anything is
written, and all files are written to a temporary folder first and moved into place at the end:
a failed export leaves no half-written file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Union

import torch
from onnxscript import opset18 as op

from pygpt import checkpoint
from pygpt.decoding import window_keep
from pygpt.models import GPT
from pygpt.nn import KVCache
from pygpt.run_files import ONNX_FP32, ONNX_INT8, RUNNER_CONFIG, TOKENIZER

OPSET = 18
Past = list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (keys, values)


def _attention(q, k, v, causal: bool = True, scale: Optional[float] = None, q_lengths=None,
               kv_lengths=None):
    """pygpt.attention in ONNX ops: scores, the mask, softmax, and the log-sum-exp the op also
    returns. Without lengths the mask is the bottom-right causal one (query i sees keys
    j <= i + Tk - Tq); with lengths it is built in the graph from them, per batch row, padded
    keys and values are zeroed and queries that see no key give zeros, as the kernels do."""
    if scale is None:
        scale_value = op.Reciprocal(op.Sqrt(op.CastLike(op.Shape(q, start=3, end=4), q)))
    else:
        scale_value = op.CastLike(op.Constant(value_float=scale), q)
    scores = op.Mul(op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2])), scale_value)
    neg_inf = op.CastLike(op.Constant(value_float=float("-inf")), q)
    tq = op.Squeeze(op.Shape(q, start=2, end=3))
    tk = op.Squeeze(op.Shape(k, start=2, end=3))
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    query_index = op.Range(zero, tq, one)  # (Tq,)
    key_index = op.Range(zero, tk, one)  # (Tk,)
    if q_lengths is None and kv_lengths is None:
        if causal:
            last_visible = op.Unsqueeze(op.Add(query_index, op.Sub(tk, tq)),
                                        op.Constant(value_ints=[1]))
            scores = op.Where(op.LessOrEqual(op.Unsqueeze(key_index, op.Constant(value_ints=[0])),
                                             last_visible), scores, neg_inf)
        out = op.MatMul(op.Softmax(scores, axis=-1), v)
        return out, op.ReduceLogSumExp(scores, op.Constant(value_ints=[-1]), keepdims=0)
    batch = op.Shape(q, start=0, end=1)

    def lengths_or_full(lengths, full):  # (B, 1, 1, 1) int64
        lengths = (op.Cast(lengths, to=7) if lengths is not None
                   else op.Expand(op.Unsqueeze(full, op.Constant(value_ints=[0])), batch))
        return op.Unsqueeze(lengths, op.Constant(value_ints=[1, 2, 3]))

    lq, lk = lengths_or_full(q_lengths, tq), lengths_or_full(kv_lengths, tk)
    i = op.Unsqueeze(query_index, op.Constant(value_ints=[1]))  # (Tq, 1)
    j = op.Unsqueeze(key_index, op.Constant(value_ints=[0]))  # (1, Tk)
    visible = op.And(op.Less(i, lq), op.Less(j, lk))  # (B, 1, Tq, Tk)
    if causal:
        visible = op.And(visible, op.LessOrEqual(j, op.Add(i, op.Sub(lk, lq))))
    real_k = op.Less(op.Transpose(j, perm=[1, 0]), lk)  # (B, 1, Tk, 1)
    v = op.Where(real_k, v, op.CastLike(op.Constant(value_float=0.0), v))
    scores = op.Where(visible, scores, neg_inf)
    sees_a_key = op.Cast(op.ReduceMax(op.Cast(visible, to=6), op.Constant(value_ints=[-1]),
                                      keepdims=1), to=9)  # (B, 1, Tq, 1) bool
    weights = op.Where(sees_a_key, op.Softmax(scores, axis=-1),
                       op.CastLike(op.Constant(value_float=0.0), q))
    out = op.MatMul(weights, v)
    return out, op.ReduceLogSumExp(scores, op.Constant(value_ints=[-1]), keepdims=0)


def _layer_norm(x, weight=None, bias=None, eps: float = 1e-5):
    """pygpt.layer_norm as LayerNormalization, whose three outputs match ours (mean and rstd
    keep the normalised axis as 1 in ONNX, so it is squeezed away)."""
    y, mean, rstd = op.LayerNormalization(x, weight, bias, axis=-1, epsilon=eps)
    axis = op.Constant(value_ints=[-1])
    return y, op.Squeeze(mean, axis), op.Squeeze(rstd, axis)


TRANSLATIONS = {torch.ops.pygpt.attention.default: _attention,
                torch.ops.pygpt.layer_norm.default: _layer_norm}


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
    shape = (batch, cfg.n_head, 0, cfg.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.n_layer)]


def _to_onnx(model: GPT, path: Path) -> None:
    from torch.export import Dim

    cfg = model.config
    batch = Dim("batch", min=1, max=4096)
    seq = Dim("seq", min=1, max=cfg.block_size)
    past_len = Dim("past", min=0, max=cfg.block_size)
    head_dim = cfg.head_dim
    # Example inputs with distinct sizes so no dimension gets specialised to a constant.
    ids = torch.zeros(2, 3, dtype=torch.long)
    past = [(torch.zeros(2, cfg.n_head, 4, head_dim), torch.zeros(2, cfg.n_head, 4, head_dim))
            for _ in range(cfg.n_layer)]
    dynamic = {"input_ids": {0: batch, 1: seq},
               "past": [({0: batch, 2: past_len}, {0: batch, 2: past_len})] * cfg.n_layer}
    inputs, outputs = io_names(cfg.n_layer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's FutureWarnings are not ours to act on
        program = torch.onnx.export(
            _CachedStep(model), (ids, past), None, input_names=inputs, output_names=outputs,
            dynamic_shapes=dynamic, custom_translation_table=TRANSLATIONS, opset_version=OPSET,
            dynamo=True, external_data=False, optimize=True, verbose=False)
    program.save(str(path), external_data=False)


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


def export(ckpt: Union[str, Path], out_dir: Union[str, Path],
           quantize: Optional[str] = None) -> list[Path]:
    """Exports the checkpoint folder ckpt into out_dir; returns the files written."""
    if quantize not in (None, "int8"):
        raise ValueError(f"--quantize supports only int8, got {quantize!r}")
    model, tokenizer = checkpoint.load(ckpt, kernels="ext")
    if not isinstance(model, GPT):
        raise ValueError(f"{ckpt} holds a {model.config.arch} model; the ONNX export handles "
                         "gpt checkpoints only so far")
    cfg = model.config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        _to_onnx(model, staging / ONNX_FP32)
        _check_against_torch(model, staging / ONNX_FP32)
        models = {"fp32": ONNX_FP32}
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice is noise here
            quantize_dynamic(str(staging / ONNX_FP32), str(staging / ONNX_INT8),
                             weight_type=QuantType.QInt8)
            models["int8"] = ONNX_INT8
        tokenizer.save(staging / TOKENIZER)
        runner_config = {
            "format": 1, "models": models, "tokenizer": {"kind": tokenizer.kind,
                                                         "file": TOKENIZER},
            "special_tokens": {}, "vocab_size": cfg.vocab_size, "block_size": cfg.block_size,
            "window_keep": window_keep(cfg.block_size), "n_layer": cfg.n_layer,
            "n_head": cfg.n_head, "head_dim": cfg.head_dim, "opset": OPSET,
            "inputs": io_names(cfg.n_layer)[0], "outputs": io_names(cfg.n_layer)[1]}
        (staging / RUNNER_CONFIG).write_text(json.dumps(runner_config, indent=2), encoding="utf-8")
        written = []
        for name in [*models.values(), TOKENIZER, RUNNER_CONFIG]:
            os.replace(staging / name, out / name)
            written.append(out / name)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pygpt.export", description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", default="out", help="checkpoint folder (default: out)")
    parser.add_argument("--out", default=None, help="output folder (default: <ckpt>/onnx)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="also write an int8 weight-quantized model")
    args = parser.parse_args(argv)
    try:
        written = export(args.ckpt, args.out or Path(args.ckpt) / "onnx", args.quantize)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
