"""pygpt's ONNX graph building, shared by the GPT and BERT exports: the table of our custom ops'
translations to standard ONNX ops (each op's own, in pygpt.ops: attention into MatMul/Softmax
with its mask built in the graph, layer norm into LayerNormalization, the fused bias + GELU and
add + layer norm into their parts), so a graph runs in stock onnxruntime with no custom-op
library; the dynamo export call; and writing an export folder as a
whole (pygpt.storage.atomic.FolderWrite, runner.json the index: removed first and moved in last), with the
int8 copies of its graphs (pygpt.onnx.int8) when asked, so a failed or killed export leaves the
previous export or the new one, never a mix."""
from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from pygpt.storage.atomic import FolderWrite, read_committed
from pygpt.onnx.int8 import Int8Settings, quantize_int8
from pygpt.ops.onnx_opset import OPSET
from pygpt.ops.registry import OPS
from pygpt.storage.run_files import RUNNER_CONFIG, TOKENIZER
from pygpt_runtime.runner_config import GRAPH_BLOCK_SIZE, export_files, read_config

# Each op's translation to standard ONNX ops, from its home in pygpt.ops (see pygpt.ops.registry).
TRANSLATIONS = {getattr(torch.ops.pygpt, op.name).default: op.onnx for op in OPS
                if op.onnx is not None}


def to_onnx(module: torch.nn.Module, args: tuple, path: Path, input_names: list[str],
            output_names: list[str], dynamic_shapes, block_size: int) -> None:
    """Exports module(*args) to path as one self-contained file, our ops translated; its
    metadata records block_size, the positions the graph holds, which the runner holds
    runner.json's block_size to (pygpt_runtime.runner_config.GRAPH_BLOCK_SIZE)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's FutureWarnings are not ours to act on
        program = torch.onnx.export(
            module, args, None, input_names=input_names, output_names=output_names,
            dynamic_shapes=dynamic_shapes, custom_translation_table=TRANSLATIONS,
            opset_version=OPSET, dynamo=True, external_data=False, optimize=True, verbose=False)
    program.model.metadata_props[GRAPH_BLOCK_SIZE] = str(block_size)
    program.save(str(path), external_data=False)


def _not_the_torchvision_notice(record: logging.LogRecord) -> bool:
    """False for the exporter's notice that torchvision (whose ops we never export) is missing,
    printed once per torchvision op; every other record passes."""
    return not str(record.msg).startswith("torchvision is not installed")


def int8_name(fp32_name: str) -> str:
    """The file name of a graph's int8 copy: model.onnx -> model.int8.onnx."""
    return fp32_name[: -len(".onnx")] + ".int8.onnx"


def models_entry(fp32: Union[str, dict[str, str]],
                 quantize: Optional[Int8Settings]) -> dict[str, Any]:
    """runner.json's "models": the fp32 graph file (or a dict of part -> file) and, with
    quantize, the int8 copies under the same layout."""
    int8 = int8_name(fp32) if isinstance(fp32, str) else {k: int8_name(v) for k, v in fp32.items()}
    return {"fp32": fp32, **({"int8": int8} if quantize is not None else {})}


def _earlier_files(out_dir: Path) -> list[str]:
    """The files that the runner.json of an earlier export in out_dir names (plain names of the
    folder: read_config refuses others); none where there is no readable one."""
    try:
        return export_files(read_committed(out_dir, RUNNER_CONFIG,
                                           lambda path: read_config(path.parent)))
    except (OSError, ValueError):
        return []


def write_export(out_dir: Path, graphs: dict[str, Callable[[Path], None]],
                 check: Callable[[Path], None], quantize: Optional[Int8Settings], tokenizer,
                 runner_config: dict) -> list[Path]:
    """Writes an export folder as a whole: graphs maps each fp32 graph's file name to the
    function writing it; check(folder) raises if the graphs staged in folder disagree with
    PyTorch; then their int8 copies (made as quantize says, recorded in runner.json's "int8";
    without, previous ones are removed), the tokenizer, and runner.json (runner_config, whose
    "models" is models_entry's; its "format", for graphs that a runner of format 1 cannot run,
    replaces 1). The files an
    earlier export there lists in its runner.json that this one does not write (another family's
    graphs) are removed with the change. Returns the paths written."""
    logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(
        _not_the_torchvision_notice)
    config = {"format": 1, "family": runner_config["family"], "task": runner_config["task"],
              "tokenizer": {"kind": tokenizer.kind, "file": TOKENIZER},
              "special_tokens": tokenizer.special_tokens, "opset": OPSET,
              **{k: v for k, v in runner_config.items() if k not in ("family", "task")},
              **({"int8": quantize.record()} if quantize is not None else {})}
    with FolderWrite(out_dir, index=RUNNER_CONFIG,
                     remove=[*(int8_name(name) for name in graphs), *_earlier_files(out_dir)],
                     ) as change:
        for name, build in graphs.items():
            change.write(name, build)
        check(change.staging)
        if quantize is not None:
            for name in graphs:
                change.write(int8_name(name), lambda path, src=change.path(name):
                             quantize_int8(src, path, quantize))
        change.write(TOKENIZER, lambda path: path.write_text(tokenizer.to_json(),
                                                             encoding="utf-8"))
        change.write(RUNNER_CONFIG, lambda path: path.write_text(json.dumps(config, indent=2),
                                                                 encoding="utf-8"))
    return change.files()
