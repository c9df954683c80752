"""Export a checkpoint to ONNX: `python -m pygpt.export --ckpt out/ --out out/onnx/`.

Each family writes its own graphs (pygpt.families: a GPT one `model.onnx` with a KV cache,
pygpt.onnx.gpt; a BERT one encoder graph, pygpt.onnx.bert; a translator an encoder and two
decoder graphs, pygpt.onnx.seq2seq), beside `tokenizer.json` and `runner.json`, which tells the
torch-free runner what the folder holds. The --out folder must be new, empty or an earlier export
(never the checkpoint's own folder). `--quantize int8` also writes the int8 weight-quantized
graphs (onnxruntime's dynamic quantizer, pygpt.onnx.int8), as --int8-weights (qint8 or quint8),
--int8-per-channel or --int8-per-tensor (default: the family's choice, per channel for a BERT) and
--int8-exclude (parts kept in float32) say; runner.json records how.

pygpt's custom ops are translated to standard ONNX ops (attention into MatMul/Softmax with its
mask, layer norm into LayerNormalization), so the graphs run in stock onnxruntime with no
custom-op library. The export is checked against PyTorch before anything is written, and the
folder changes as a whole (pygpt.onnx.graph.write_export): a failed or killed export leaves the
earlier export or the new one, never a mix. The folder is locked while the export writes into
it, as a training run locks its own (pygpt.training.run_folder): a second export into it is
refused.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Union

from pygpt.storage import checkpoint
from pygpt.families import family
from pygpt.storage.atomic import committed_path, is_leftover, read_committed
from pygpt.onnx.graph import OPSET, TRANSLATIONS
from pygpt.onnx.int8 import PARTS, WEIGHT_TYPES, Int8Settings
from pygpt.storage.run_files import CONFIG, RUNNER_CONFIG, WEIGHTS
from pygpt.training.run_folder import LOCK, RunFolder
from pygpt_runtime.runner_config import read_config as read_runner_config

__all__ = ["OPSET", "TRANSLATIONS", "export", "main"]


def check_out(ckpt: Path, out: Path) -> None:
    """Refuses an --out where the export would mix with other files: the checkpoint folder, a
    folder holding a checkpoint, or one holding anything but a previous pygpt export (a
    runner.json that pygpt_runtime reads as one)."""
    if out.resolve() == ckpt.resolve():
        raise ValueError(f"--out {out} is the checkpoint folder itself; the export needs a "
                         f"folder of its own (default: {ckpt / 'onnx'})")
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if any(committed_path(out, name).exists() for name in (CONFIG, WEIGHTS)):
        raise ValueError(f"--out {out} holds a checkpoint; export into a folder of its own")
    held = [p.name for p in out.iterdir() if not is_leftover(p.name) and p.name != LOCK]
    if not held:
        return
    if not committed_path(out, RUNNER_CONFIG).exists():
        raise ValueError(f"--out {out} is not empty and holds no pygpt export (no "
                         f"{RUNNER_CONFIG}); export into a new or empty folder, or over an "
                         "earlier export")
    try:  # the runner's own reading of it: an export whose files this one may replace
        read_committed(out, RUNNER_CONFIG, lambda path: read_runner_config(path.parent))
    except (OSError, ValueError):
        raise ValueError(f"--out {out} holds a {RUNNER_CONFIG} that is not a pygpt export's; "
                         "export into a new or empty folder, or over an earlier export") from None


def export(ckpt: Union[str, Path], out_dir: Union[str, Path], quantize: Optional[str] = None,
           int8: Optional[Int8Settings] = None) -> list[Path]:
    """Exports the checkpoint folder ckpt into out_dir with its family's exporter; returns the
    files written. quantize "int8": the int8 graphs too, made as int8 says (default: QInt8
    weights, scaled as the family chooses, every part quantized)."""
    if quantize not in (None, "int8"):
        raise ValueError(f"--quantize supports only int8, got {quantize!r}")
    if int8 is not None and quantize is None:
        raise ValueError("the --int8-* settings need --quantize int8")
    check_out(Path(ckpt), Path(out_dir))
    with RunFolder(out_dir, what="export"):
        model, tokenizer = checkpoint.load(ckpt, kernels="ext")
        fam = family(model.config.arch)
        settings = ((int8 or Int8Settings()).resolved(fam.int8_per_channel)
                    if quantize == "int8" else None)
        return fam.export(model, tokenizer, checkpoint.load_labels(ckpt), Path(out_dir),
                          settings)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pygpt.export", description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", default="out", help="checkpoint folder (default: out)")
    parser.add_argument("--out", default=None, help="output folder (default: <ckpt>/onnx)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="also write an int8 weight-quantized model")
    parser.add_argument("--int8-weights", choices=WEIGHT_TYPES, default=None,
                        help="int8: the weights' type (default qint8; quint8 can be the more "
                             "accurate for small BERTs)")
    scales = parser.add_mutually_exclusive_group()
    scales.add_argument("--int8-per-channel", dest="int8_per_channel", action="store_const",
                        const=True, default=None,
                        help="int8: one scale per output channel (a BERT's default)")
    scales.add_argument("--int8-per-tensor", dest="int8_per_channel", action="store_const",
                        const=False,
                        help="int8: one scale per weight tensor (a GPT's and a translator's "
                             "default)")
    parser.add_argument("--int8-exclude", nargs="+", choices=PARTS, default=[],
                        help="int8: parts kept in float32 (head: the output layer)")
    args = parser.parse_args(argv)
    given = (args.int8_weights is not None or args.int8_per_channel is not None
             or args.int8_exclude)
    try:
        int8 = (Int8Settings(args.int8_weights or "qint8", args.int8_per_channel,
                             tuple(args.int8_exclude)) if given else None)
        written = export(args.ckpt, args.out or Path(args.ckpt) / "onnx", args.quantize, int8)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:  # e.g. an --out that cannot be written
        raise SystemExit(f"error: {e.filename or args.out}: {e.strerror or e}") from None
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
