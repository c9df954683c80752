"""Export a checkpoint to ONNX: `python -m pygpt.export --ckpt out/ --out out/onnx/`.

Writes one self-contained `model.onnx` with a KV cache, in the convention onnxruntime-genai and
Optimum use: inputs `input_ids` (batch, seq) and `past_key_values.{i}.key` / `.value`
(batch, heads, past, head_dim); outputs `logits` (batch, seq, vocab) and `present.{i}.key` /
`.value` (batch, heads, past + seq, head_dim). Batch, sequence and past length are dynamic; a past
of length 0 is the prefill, and positions are derived from the past length, so a decode step at
any offset is right. Beside it: `tokenizer.json`, and `runner.json` with what the runner needs.
The --out folder must be new, empty or an earlier export (never the checkpoint's own folder).
`--quantize int8` also writes `model.int8.onnx` (weights quantized by onnxruntime's own tooling).

pygpt's custom ops are translated to standard ONNX ops (attention into MatMul/Softmax with the
bottom-right causal mask, layer norm into LayerNormalization), so the graph runs in stock
onnxruntime with no custom-op library. The export is checked against PyTorch before anything is
written, and the folder changes as a whole (pygpt.onnx_graph.write_export): a failed or killed
export leaves the earlier export or the new one, never a mix.

A BERT checkpoint (pretrained, or fine-tuned to classify) is exported by pygpt.export_bert:
inputs `input_ids`, `attention_mask`, `token_type_ids` (batch, seq), output `logits`. An
encoder-decoder (seq2seq) is exported by pygpt.export_seq2seq as an encoder and two decoder graphs,
run by export/onnx_translate.py.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Union

import torch

from pygpt import checkpoint
from pygpt.decoding import window_keep
from pygpt.export_bert import export_bert
from pygpt.io import committed_path, is_leftover
from pygpt.export_seq2seq import export_seq2seq_model
from pygpt.models import BERT, GPT, Seq2Seq
from pygpt.nn import KVCache
from pygpt.onnx_graph import OPSET, TRANSLATIONS, models_entry, to_onnx, write_export
from pygpt.run_files import CONFIG, ONNX_FP32, RUNNER_CONFIG, WEIGHTS

__all__ = ["OPSET", "TRANSLATIONS", "export", "main"]
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


def check_out(ckpt: Path, out: Path) -> None:
    """Refuses an --out where the export would mix with other files: the checkpoint folder, a
    folder holding a checkpoint, or one holding anything but a previous pygpt export."""
    if out.resolve() == ckpt.resolve():
        raise ValueError(f"--out {out} is the checkpoint folder itself; the export needs a "
                         f"folder of its own (default: {ckpt / 'onnx'})")
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if any(committed_path(out, name).exists() for name in (CONFIG, WEIGHTS)):
        raise ValueError(f"--out {out} holds a checkpoint; export into a folder of its own")
    held = [p.name for p in out.iterdir() if not is_leftover(p.name)]
    if held and not committed_path(out, RUNNER_CONFIG).exists():
        raise ValueError(f"--out {out} is not empty and holds no pygpt export (no "
                         f"{RUNNER_CONFIG}); export into a new or empty folder, or over an "
                         "earlier export")


def export(ckpt: Union[str, Path], out_dir: Union[str, Path],
           quantize: Optional[str] = None) -> list[Path]:
    """Exports the checkpoint folder ckpt (a GPT, or a BERT: see pygpt.export_bert) into
    out_dir; returns the files written."""
    if quantize not in (None, "int8"):
        raise ValueError(f"--quantize supports only int8, got {quantize!r}")
    check_out(Path(ckpt), Path(out_dir))
    model, tokenizer = checkpoint.load(ckpt, kernels="ext")
    if isinstance(model, BERT):
        return export_bert(model, tokenizer, checkpoint.load_labels(ckpt), out_dir, quantize)
    if isinstance(model, Seq2Seq):
        return export_seq2seq_model(model, tokenizer, out_dir, quantize)
    if not isinstance(model, GPT):
        raise ValueError(f"{ckpt} holds a {model.config.arch} model; the ONNX export handles "
                         "gpt, bert and seq2seq checkpoints only")
    cfg = model.config
    runner_config = {"family": "gpt", "task": "generate", "vocab_size": cfg.vocab_size,
                     "block_size": cfg.block_size, "window_keep": window_keep(cfg.block_size),
                     "n_layer": cfg.n_layer, "n_head": cfg.n_head, "head_dim": cfg.head_dim,
                     "inputs": io_names(cfg.n_layer)[0], "outputs": io_names(cfg.n_layer)[1]}
    return write_export(Path(out_dir), {ONNX_FP32: lambda path: _to_onnx(model, path)},
                        lambda folder: _check_against_torch(model, folder / ONNX_FP32),
                        quantize, tokenizer,
                        {**runner_config, "models": models_entry(ONNX_FP32, quantize)})


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
    except OSError as e:  # e.g. an --out that cannot be written
        raise SystemExit(f"error: {e.filename or args.out}: {e.strerror or e}") from None
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
