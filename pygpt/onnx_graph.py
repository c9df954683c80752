"""pygpt's ONNX graph building, shared by the GPT and BERT exports: the translations of our custom
ops to standard ONNX ops (attention into MatMul/Softmax with its mask built in the graph, layer
norm into LayerNormalization, the fused bias + GELU and add + layer norm into their parts), so a
graph runs in stock onnxruntime with no custom-op library; the dynamo export call; int8 weight
quantization; and writing an export folder as a whole (pygpt.io.FolderWrite, runner.json the
index: removed first and moved in last), so a failed or killed export leaves the previous export
or the new one, never a mix."""
from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from onnxscript import opset18 as op

from pygpt.io import FolderWrite
from pygpt.run_files import RUNNER_CONFIG, TOKENIZER

OPSET = 18


def _position_bias(distance, rel_bias, alibi_slopes, like):
    """The (1 or B, H, Tq, Tk) score bias of the key - query distances (1 or B, 1, Tq, Tk):
    rel_bias[h, clamp(d, -R, R) + R] gathered from the table (H, 2R + 1), minus
    alibi_slopes[h] * |d|; like the kernels, but built in full in the graph."""
    bias = op.CastLike(op.Constant(value_float=0.0), like)
    if rel_bias is not None:
        width = op.Squeeze(op.Shape(rel_bias, start=1, end=2))
        R = op.Div(op.Sub(width, op.Constant(value_int=1)), op.Constant(value_int=2))
        bucket = op.Add(op.Clip(distance, op.Neg(R), R), R)
        gathered = op.Squeeze(op.Gather(rel_bias, bucket, axis=1), op.Constant(value_ints=[2]))
        bias = op.Add(bias, op.Transpose(gathered, perm=[1, 0, 2, 3]))  # (H, B, ..) -> (B, H, ..)
    if alibi_slopes is not None:
        slopes = op.Unsqueeze(alibi_slopes, op.Constant(value_ints=[0, 2, 3]))  # (1, H, 1, 1)
        bias = op.Sub(bias, op.Mul(slopes, op.CastLike(op.Abs(distance), like)))
    return bias


def _attention(q, k, v, causal: bool = True, scale: Optional[float] = None, q_lengths=None,
               kv_lengths=None, rel_bias=None, alibi_slopes=None):
    """pygpt.attention in ONNX ops: scores, the position bias, the mask, softmax, and the
    log-sum-exp the op also returns. Without lengths the mask is the bottom-right causal one
    (query i sees keys j <= i + Tk - Tq); with lengths it is built in the graph from them, per
    batch row, padded keys and values are zeroed and queries that see no key give zeros, as the
    kernels do. A relative or ALiBi bias (rel_bias, alibi_slopes) is built in the graph as a
    (B, H, Tq, Tk) tensor from the distances, query i at position i + kv_len - q_len."""
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
    biased = rel_bias is not None or alibi_slopes is not None
    if q_lengths is None and kv_lengths is None:
        if biased:
            distance = op.Sub(op.Unsqueeze(key_index, op.Constant(value_ints=[0])),
                              op.Unsqueeze(op.Add(query_index, op.Sub(tk, tq)),
                                           op.Constant(value_ints=[1])))  # (Tq, Tk)
            distance = op.Unsqueeze(distance, op.Constant(value_ints=[0, 1]))
            scores = op.Add(scores, _position_bias(distance, rel_bias, alibi_slopes, q))
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
    if biased:
        distance = op.Sub(j, op.Add(i, op.Sub(lk, lq)))  # (B, 1, Tq, Tk)
        scores = op.Add(scores, _position_bias(distance, rel_bias, alibi_slopes, q))
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


def _rotary(x, cos, sin, positions, inverse: bool = False):
    """pygpt.rotary in plain ONNX math: the angles of the positions gathered from the tables and
    shaped (B or 1, 1, T, half) to broadcast over the heads, the two halves of the rotated
    channels sliced out and rotated with Mul and Add/Sub, the channels past them concatenated
    back."""
    half = op.Shape(cos, start=1, end=2)
    angles_shape = op.Concat(op.Constant(value_ints=[-1, 1]), op.Shape(x, start=2, end=3), half,
                             axis=0)
    c = op.Reshape(op.Gather(cos, positions, axis=0), angles_shape)
    s = op.Reshape(op.Gather(sin, positions, axis=0), angles_shape)
    if inverse:
        s = op.Neg(s)
    axis, start = op.Constant(value_ints=[3]), op.Constant(value_ints=[0])
    rotated, end = op.Add(half, half), op.Constant(value_ints=[2**62])
    x1, x2 = op.Slice(x, start, half, axis), op.Slice(x, half, rotated, axis)
    return op.Concat(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), op.Add(op.Mul(x2, c), op.Mul(x1, s)),
                     op.Slice(x, rotated, end, axis), axis=3)


def _bias_gelu(x, bias):
    """pygpt.bias_gelu as the exact GELU of x + bias, h * (1 + erf(h / sqrt 2)) / 2 (opset 18
    has Erf but no Gelu)."""
    h = op.Add(x, bias)
    half = op.CastLike(op.Constant(value_float=0.5), h)
    one = op.CastLike(op.Constant(value_float=1.0), h)
    root_half = op.CastLike(op.Constant(value_float=0.7071067811865476), h)
    return op.Mul(op.Mul(h, half), op.Add(one, op.Erf(op.Mul(h, root_half))))


def _add_layer_norm(x, residual, weight=None, bias=None, eps: float = 1e-5):
    """pygpt.add_layer_norm as Add and then LayerNormalization (as _layer_norm)."""
    s = op.Add(x, residual)
    return (s, *_layer_norm(s, weight, bias, eps))


TRANSLATIONS = {torch.ops.pygpt.attention.default: _attention,
                torch.ops.pygpt.layer_norm.default: _layer_norm,
                torch.ops.pygpt.rotary.default: _rotary,
                torch.ops.pygpt.bias_gelu.default: _bias_gelu,
                torch.ops.pygpt.add_layer_norm.default: _add_layer_norm}


def to_onnx(module: torch.nn.Module, args: tuple, path: Path, input_names: list[str],
            output_names: list[str], dynamic_shapes) -> None:
    """Exports module(*args) to path as one self-contained file, our ops translated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's FutureWarnings are not ours to act on
        program = torch.onnx.export(
            module, args, None, input_names=input_names, output_names=output_names,
            dynamic_shapes=dynamic_shapes, custom_translation_table=TRANSLATIONS,
            opset_version=OPSET, dynamo=True, external_data=False, optimize=True, verbose=False)
    program.save(str(path), external_data=False)


def quantize_int8(src: Path, dst: Path) -> None:
    """dst: src with its weights quantized to int8 by onnxruntime's own tooling."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice is noise here
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


def _not_the_torchvision_notice(record: logging.LogRecord) -> bool:
    """False for the exporter's notice that torchvision (whose ops we never export) is missing,
    printed once per torchvision op; every other record passes."""
    return not str(record.msg).startswith("torchvision is not installed")


def int8_name(fp32_name: str) -> str:
    """The file name of a graph's int8 copy: model.onnx -> model.int8.onnx."""
    return fp32_name[: -len(".onnx")] + ".int8.onnx"


def models_entry(fp32: Union[str, dict[str, str]], quantize: Optional[str]) -> dict[str, Any]:
    """runner.json's "models": the fp32 graph file (or a dict of part -> file) and, with
    quantize "int8", the int8 copies under the same layout."""
    int8 = int8_name(fp32) if isinstance(fp32, str) else {k: int8_name(v) for k, v in fp32.items()}
    return {"fp32": fp32, **({"int8": int8} if quantize == "int8" else {})}


def write_export(out_dir: Path, graphs: dict[str, Callable[[Path], None]],
                 check: Callable[[Path], None], quantize: Optional[str], tokenizer,
                 runner_config: dict) -> list[Path]:
    """Writes an export folder as a whole: graphs maps each fp32 graph's file name to the
    function writing it; check(folder) raises if the graphs staged in folder disagree with
    PyTorch; then their int8 copies (quantize "int8", else previous ones are removed), the
    tokenizer, and runner.json (runner_config, whose "models" is models_entry's). Returns the
    paths written."""
    logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(
        _not_the_torchvision_notice)
    config = {"format": 1, "family": runner_config["family"], "task": runner_config["task"],
              "tokenizer": {"kind": tokenizer.kind, "file": TOKENIZER},
              "special_tokens": tokenizer.special_tokens, "opset": OPSET,
              **{k: v for k, v in runner_config.items() if k not in ("family", "task")}}
    with FolderWrite(out_dir, index=RUNNER_CONFIG,
                     remove=[int8_name(name) for name in graphs]) as change:
        for name, build in graphs.items():
            change.write(name, build)
        check(change.staging)
        if quantize == "int8":
            for name in graphs:
                change.write(int8_name(name),
                             lambda path, src=change.path(name): quantize_int8(src, path))
        change.write(TOKENIZER, lambda path: path.write_text(tokenizer.to_json(),
                                                             encoding="utf-8"))
        change.write(RUNNER_CONFIG, lambda path: path.write_text(json.dumps(config, indent=2),
                                                                 encoding="utf-8"))
    return change.files()
