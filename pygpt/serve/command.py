"""`python -m pygpt.serve --model EXPORT_DIR`: the HTTP server of an ONNX export, the same as the
torch-free runtime's `pygpt-serve` (pygpt_runtime.serve.command), which it runs without
importing torch; `python -m pygpt.serve --ckpt RUN` serves a checkpoint of any family on
pygpt's torch model instead, with attention maps in the playground (pygpt.serve.checkpoint,
imported only then)."""
from __future__ import annotations

from typing import Any, Optional

from pygpt_runtime.serve import command as serve_command


def _open_checkpoint(ckpt: str, limits: Any, threads: Optional[int], dtype: str) -> Any:
    try:
        from pygpt.serve.checkpoint import open_checkpoint
    except ImportError as e:
        raise ImportError(f"--ckpt needs PyTorch and pygpt's kernels ({e}); serve an export "
                          "with --model where they are missing") from None
    return open_checkpoint(ckpt, limits, threads, dtype)


CHECKPOINTS = serve_command.Checkpoints(
    "a checkpoint folder of any family (config.json, model.safetensors), served with PyTorch, "
    "with attention maps (POST /v1/attention and in the playground)",
    ("float32", "bfloat16", "float16"), _open_checkpoint)


def main(argv: Optional[list[str]] = None) -> None:
    serve_command.main(argv, CHECKPOINTS)


if __name__ == "__main__":
    main()
