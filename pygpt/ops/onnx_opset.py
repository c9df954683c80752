"""The ONNX opset that the ops' ONNX translations (each op's `*_onnx` function) write and the
exporter (pygpt.onnx.graph) declares, and onnxscript's ops of it, imported on first use: onnxscript
takes longer to import than pygpt.ops itself, and only an export needs it."""
from __future__ import annotations

import importlib
from typing import Any

OPSET = 18


def onnx_ops() -> Any:
    """onnxscript's opset OPSET (`op.Add(...)`, `op.MatMul(...)`, ...)."""
    return getattr(importlib.import_module("onnxscript"), f"opset{OPSET}")
