"""torch's and safetensors' file writers, with the OS's refusal to write kept an OSError.

A save the OS refuses (no space left, a read-only disk, a quota) is one line naming the folder
and the reason, with the folder's previous contents intact (pygpt.storage.atomic.FolderWrite): that needs
the refusal to arrive as the OSError it is. Both serializers hide it: torch.save reports a
failed write as a RuntimeError ("unexpected pos ..."), even when it writes to a Python file
object, and safetensors as a SafetensorError whose message ends in "(os error 28)"."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import save_model


class _KeepsRefusal:
    """A writable file for torch.save that remembers the OSError of a failed write."""

    def __init__(self, f: Any):
        self.f, self.refusal = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.refusal = self.refusal or e
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj: Any, path: Path) -> None:
    """torch.save(obj) into a new file at path."""
    with open(path, "wb") as f:
        keeping = _KeepsRefusal(f)
        try:
            torch.save(obj, keeping)
        except Exception:
            if keeping.refusal is not None:
                raise keeping.refusal from None
            raise


def save_weights(model: torch.nn.Module, path: Path, metadata: Optional[dict[str, str]]) -> None:
    """The model's weights as safetensors (shared tensors once, as safetensors' save_model)."""
    try:
        save_model(model, str(path), metadata=metadata)
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None
