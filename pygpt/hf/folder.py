"""The rules of a Hugging Face model folder as pygpt reads one (`python -m pygpt.convert
--from-hf DIR`): config.json and model.safetensors, beside the tokenizer's files. The folder may
come from anyone, so:

- every file read is a regular file of the folder itself: a symbolic link (as in the Hub's cache,
  whose snapshots link into a blob store) is refused, never followed;
- JSON and text files are read up to a size limit, and must be what their name says;
- weights are read from safetensors only. A folder with only a pickle (pytorch_model.bin) is
  refused with how to convert it: pygpt never unpickles a file, which could run code;
- the tensors' names, shapes and types are checked against the model the config describes
  before any tensor is read (WeightsFile).

Every refusal is a one-line ValueError naming the file."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError, safe_open

from pygpt.storage.targets import check_folder
from pygpt_runtime.json_file import parse_json

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PICKLES = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
SHARD_INDEX = "model.safetensors.index.json"
MAX_JSON_BYTES = 1 << 20  # config.json, tokenizer_config.json
MAX_TOKENIZER_BYTES = 64 << 20  # vocab.json, merges.txt, vocab.txt, tokenizer.json
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def regular_file(folder: Path, name: str) -> Optional[Path]:
    """folder/name if it is a regular file; None if absent; a ValueError for a link or any other
    kind of file."""
    path = folder / name
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(mode):
        raise ValueError(f"{path} is a symbolic link, which pygpt does not follow; copy the folder "
                         "with its files themselves (cp -rL, or download with local_dir)")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is not a regular file")
    return path


def read_text(folder: Path, name: str, limit: int = MAX_TOKENIZER_BYTES) -> Optional[str]:
    """The UTF-8 text of folder/name (None if absent), at most limit bytes."""
    path = regular_file(folder, name)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise ValueError(f"{path} is larger than the {limit >> 20} MiB pygpt reads for it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_json(folder: Path, name: str, limit: int = MAX_JSON_BYTES) -> Optional[dict[str, Any]]:
    """The JSON object in folder/name (None if absent)."""
    text = read_text(folder, name, limit)
    if text is None:
        return None
    value = parse_json(text, str(folder / name))
    if not isinstance(value, dict):
        raise ValueError(f"{folder / name} must hold a JSON object")
    return value


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json, after the folder itself and its weights file are checked to
    exist (a missing folder, a pickle-only one, sharded weights: one line each)."""
    check_folder(folder, "--from-hf")
    if not folder.is_dir():
        raise ValueError(f"no Hugging Face model folder at {folder}")
    if regular_file(folder, WEIGHTS) is None:
        pickles = [name for name in PICKLES if regular_file(folder, name) is not None]
        if pickles:
            raise ValueError(
                f"{folder} holds {pickles[0]} but no {WEIGHTS}; pygpt never loads pickled "
                "weights (they can run code). Convert them where you trust the file, e.g. "
                "transformers' AutoModel.from_pretrained(DIR).save_pretrained(NEW_DIR) "
                "(safetensors by default), and convert NEW_DIR")
        if regular_file(folder, SHARD_INDEX) is not None:
            raise ValueError(f"{folder} holds sharded weights ({SHARD_INDEX}); pygpt reads one "
                             f"{WEIGHTS}: save the model again with a larger max_shard_size")
        raise ValueError(f"{folder} has no {WEIGHTS}")
    config = read_json(folder, CONFIG)
    if config is None:
        raise ValueError(f"{folder} has no {CONFIG}")
    return config


class WeightsFile:
    """The folder's model.safetensors, open: its tensor names and, checked first, its tensors."""

    def __init__(self, folder: Path):
        self.path = regular_file(folder, WEIGHTS)
        try:
            self._file = safe_open(str(self.path), framework="pt", device="cpu")
            self.names = set(self._file.keys())
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"{self.path} is truncated, corrupt or not a safetensors file: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(name).get_shape())

    def check(self, expected: dict[str, tuple[int, ...]], ignored: set[str]) -> None:
        """A ValueError unless the file holds each tensor of expected (name -> shape) in that
        shape, and nothing else but the names in ignored."""
        missing = sorted(set(expected) - self.names)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"{self.path} lacks {', '.join(missing[:3])}{more}, which the "
                             "config's model needs")
        unexpected = sorted(self.names - set(expected) - ignored)
        if unexpected:
            more = f" and {len(unexpected) - 3} more" if len(unexpected) > 3 else ""
            raise ValueError(f"{self.path} holds {', '.join(unexpected[:3])}{more}, which the "
                             "config's model does not have")
        for name, shape in expected.items():
            if self.shape(name) != shape:
                raise ValueError(f"{self.path}: {name} has shape {self.shape(name)} but the "
                                 f"config's model needs {shape}")

    def tensor(self, name: str) -> torch.Tensor:
        t = self._file.get_tensor(name)
        if t.dtype not in FLOAT_TYPES:
            raise ValueError(f"{self.path}: {name} holds {t.dtype}, not floating point numbers")
        if not t.isfinite().all():
            raise ValueError(f"{self.path}: {name} holds NaN or infinity")
        return t
