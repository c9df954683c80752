"""Training text: reading it (UTF-8 only), tokenizing it, the 90/10 train/val split, and random
context windows as batches. The tiny-Shakespeare text (public domain) ships inside the package."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch

SHIPPED_TEXT = Path(__file__).resolve().parent / "data" / "tinyshakespeare.txt"


def read_text(path: Optional[Union[str, Path]] = None) -> str:
    """The text of a UTF-8 file (the shipped corpus when path is None); clear errors otherwise."""
    path = Path(path) if path is not None else SHIPPED_TEXT
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"no data file at {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; --data takes a text file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at offset "
                         f"{e.start}); convert it to UTF-8 first") from None
    if not text:
        raise ValueError(f"{path} is empty")
    return text


class TokenSplits:
    """Token ids split 90/10 into train and val, sampled as (x, y) windows of block_size."""

    def __init__(self, tokens: torch.Tensor, block_size: int, val_fraction: float = 0.1):
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
              generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """batch_size random windows: inputs x and next-token targets y, both (batch, block_size)."""
        data = self.splits[split]
        T = self.block_size
        starts = torch.randint(len(data) - T, (batch_size,), generator=generator)
        windows = data.unfold(0, T + 1, 1)[starts]
        return windows[:, :-1], windows[:, 1:]
