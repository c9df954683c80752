"""Training text: reading it (UTF-8 only, piece by piece), tokenizing it once into a
memory-mapped token file cached beside the data, the 90/10 train/val split, and random context
windows as batches. A text larger than memory is never held in RAM: it is hashed, tokenized and
written in chunks, and training reads windows straight from the mapped file. A cache records its
length and a digest of its bytes, checked whenever it is mapped: a truncated or damaged cache is
rebuilt, never used. Writing a new cache removes those of earlier contents of the same file, so
they do not pile up. The tiny-Shakespeare text (public domain) ships inside the package."""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterator, NamedTuple, Optional, Union

import numpy as np
import torch

from pygpt.storage.atomic import atomic_write, atomic_write_text
from pygpt_runtime.json_file import read_json

SHIPPED_TEXT = Path(__file__).resolve().parent.parent / "corpus" / "tinyshakespeare.txt"
CHUNK_BYTES = 1 << 20
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pygpt"


def data_path(path: Optional[Union[str, Path]]) -> Path:
    return Path(path) if path is not None else SHIPPED_TEXT


def check_data_file(path: Optional[Union[str, Path]], flag: str = "--data") -> Path:
    """The data file's path (the shipped corpus when path is None), checked to be a readable,
    non-empty file: what a run can verify before it starts."""
    path = data_path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; {flag} takes a text file")
    try:
        with open(path, "rb") as f:
            empty = not f.read(1)
    except FileNotFoundError:
        raise FileNotFoundError(f"no data file at {path}") from None
    except OSError as e:
        raise ValueError(f"cannot read {flag} {path}: {e.strerror or e}") from None
    if empty:
        raise ValueError(f"{path} is empty")
    return path


def read_chunks(path: Optional[Union[str, Path]] = None) -> Iterator[str]:
    """The text of a UTF-8 file (the shipped corpus when path is None), in chunks of about a
    megabyte that end at a line break where possible (so BPE never sees a word cut in two)."""
    path = check_data_file(path)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    offset, carry = 0, ""
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.read(CHUNK_BYTES)
                held = decoder.getstate()[0]  # bytes of a character cut by the last chunk's end
                try:
                    text = carry + decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as e:  # e.start counts from the held bytes
                    raise ValueError(f"{path} is not UTF-8 text (invalid byte "
                                     f"0x{(held + raw)[e.start]:02x} at offset "
                                     f"{offset - len(held) + e.start}); convert it to UTF-8 "
                                     "first") from None
                offset += len(raw)
                if not raw:
                    break
                cut = text.rfind("\n") + 1 or len(text)
                if text[:cut]:
                    yield text[:cut]
                carry = text[cut:]
    except FileNotFoundError:  # removed since it was checked
        raise FileNotFoundError(f"no data file at {path}") from None
    if carry:
        yield carry


def read_text(path: Optional[Union[str, Path]] = None) -> str:
    """The whole text of a UTF-8 file (for texts that fit in memory)."""
    return "".join(read_chunks(path))


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


class TokenFile:
    """The token ids of a text file under a tokenizer, as a read-only memory map, made once and
    found again by the hash of the file's content and of the tokenizer."""

    def __init__(self, tokens: np.ndarray, n_chars: int):
        self.tokens, self.n_chars = tokens, n_chars

    @property
    def chars_per_token(self) -> float:
        return self.n_chars / max(1, len(self.tokens))

    @classmethod
    def load(cls, path: Optional[Union[str, Path]], tokenizer) -> "TokenFile":
        path = data_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no data file at {path}")
        content = _file_hash(path)[:16]
        key = content + "-" + hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()[:16]
        dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
        name = f".{path.name}.{key}.tokens.{np.dtype(dtype).name}"
        for folder in (path.parent, USER_CACHE):
            found = _map_cache(folder / name, dtype)
            if found is not None:
                return cls(*found)
        for folder in (path.parent, USER_CACHE):  # beside the data, or the user cache if read-only
            try:
                folder.mkdir(parents=True, exist_ok=True)
                n_chars = _tokenize_to(path, tokenizer, dtype, folder / name)
                tokens = np.memmap(folder / name, dtype=dtype, mode="r")
                atomic_write_text(folder / (name + ".json"), json.dumps(
                    {"chars": n_chars, "tokens": len(tokens), "sha256": _file_hash(folder / name)}))
                _remove_stale_caches(folder, path.name, content)
                return cls(tokens, n_chars)
            except FileNotFoundError:  # the data, removed since it was checked
                raise
            except OSError as e:  # read-only, full, over a quota: the next place, or the error
                with contextlib.suppress(OSError):  # tokens without their metadata
                    (folder / name).unlink(missing_ok=True)
                refused = e
                print(f"note: cannot write a token cache in {folder} ({e.strerror or e})",
                      file=sys.stderr)
        raise OSError(refused.errno, f"cannot write a token cache beside {path} nor in "
                                     f"{USER_CACHE} ({refused.strerror or refused})")


def _map_cache(cached: Path, dtype) -> Optional[tuple[np.ndarray, int]]:
    """The tokens and character count of a cache, None if there is none or it does not match
    the length and digest its metadata records (truncated, damaged, or from a pygpt that did
    not record them): then it is rebuilt."""
    meta_path = cached.with_name(cached.name + ".json")
    if not (cached.exists() and meta_path.exists()):
        return None
    try:
        meta = read_json(meta_path)
        whole = (cached.stat().st_size == meta["tokens"] * np.dtype(dtype).itemsize
                 and _file_hash(cached) == meta["sha256"])
        n_chars = int(meta["chars"])
    except (OSError, ValueError, KeyError, TypeError):
        whole = False
    if not whole:
        print(f"warning: the token cache {cached} is truncated, damaged or from an older pygpt; "
              "tokenizing the data again", file=sys.stderr)
        return None
    return np.memmap(cached, dtype=dtype, mode="r"), n_chars


def _remove_stale_caches(folder: Path, data_name: str, content: str) -> None:
    """Removes the caches (tokens and metadata) of the data file named data_name whose content
    hash is not `content`: those of its earlier contents. (In the user cache, a file of the same
    name from another folder loses its cache too, and is tokenized again when next used.)"""
    pattern = re.compile(re.escape(f".{data_name}.") +
                         r"(?P<content>[0-9a-f]{16})-[0-9a-f]{16}\.tokens\.uint(16|32)(\.json)?")
    for entry in folder.iterdir():
        match = pattern.fullmatch(entry.name)
        if match is not None and match["content"] != content:
            entry.unlink(missing_ok=True)


def _tokenize_to(path: Path, tokenizer, dtype, out: Path) -> int:
    """Writes the token ids of the file at path to out (raw dtype array); returns its length in
    characters."""
    n_chars = 0

    def write(tmp: Path) -> None:
        nonlocal n_chars
        with open(tmp, "wb") as f:
            for chunk in read_chunks(path):
                n_chars += len(chunk)
                f.write(np.asarray(tokenizer.encode(chunk), dtype=dtype).tobytes())

    atomic_write(out, write)
    return n_chars


class LMBatch(NamedTuple):
    """Next-token training data; the fields are the GPT's forward arguments."""

    idx: torch.Tensor  # (B, T) int64 inputs
    targets: torch.Tensor  # (B, T) int64: the token after each input


class TokenSplits:
    """Token ids split 90/10 into train and val, sampled as (x, y) windows of block_size."""

    def __init__(self, tokens: Union[np.ndarray, torch.Tensor], block_size: int,
                 val_fraction: float = 0.1):
        tokens = tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens
        n_train = int(len(tokens) * (1 - val_fraction))
        self.block_size = block_size
        self.splits = {"train": tokens[:n_train], "val": tokens[n_train:]}
        for name, data in self.splits.items():
            if len(data) <= block_size:
                raise ValueError(
                    f"text too short: the {name} split has {len(data)} tokens, but a context of "
                    f"{block_size} needs at least {block_size + 1} (the text has {len(tokens)} "
                    f"tokens, {val_fraction:.0%} of them for val); use a longer text or a smaller "
                    "--block-size")

    def batch(self, split: str, batch_size: int,
              generator: Optional[torch.Generator] = None) -> LMBatch:
        """batch_size random windows: inputs x and next-token targets y, both (batch, block_size)
        int64, read from the (possibly memory-mapped) token array."""
        data = self.splits[split]
        T = self.block_size
        starts = torch.randint(len(data) - T, (batch_size,), generator=generator).numpy()
        windows = torch.from_numpy(data[starts[:, None] + np.arange(T + 1)].astype(np.int64))
        return LMBatch(windows[:, :-1], windows[:, 1:])
