"""How a pygpt tensor is made of a Hugging Face checkpoint's tensors and back: one TensorMap per
pygpt tensor, naming the HF tensors it is built of. A map stacks its HF tensors by rows (BERT's
separate query, key and value into our fused qkv) and may transpose them (GPT-2's Conv1D keeps a
weight as (in, out), torch's Linear as (out, in)); export splits and transposes back, so a round
trip gives the same numbers bit for bit.

The shapes each HF tensor must have follow from the pygpt model (built on the meta device), so a
folder's tensors are checked against them before any is read."""
from __future__ import annotations

from dataclasses import dataclass
import reprlib
from typing import Any, Mapping

import torch

from pygpt.config import ModelConfig


@dataclass(frozen=True)
class TensorMap:
    ours: str  # the pygpt state_dict name
    theirs: tuple[str, ...]  # the HF names, stacked by rows in this order
    transposed: bool = False  # HF stores each as (in, out): Conv1D

    def their_shapes(self, our_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The shape of each HF tensor for a pygpt tensor of our_shape."""
        rows = our_shape[0] // len(self.theirs)
        part = (rows, *our_shape[1:])
        return [tuple(reversed(part)) if self.transposed else part] * len(self.theirs)

    def to_ours(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = [tensors[name].t() if self.transposed else tensors[name] for name in self.theirs]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, 0)).float().contiguous()

    def to_theirs(self, ours: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = ours.detach().chunk(len(self.theirs), 0)
        return {name: (part.t() if self.transposed else part).contiguous().clone()
                for name, part in zip(self.theirs, parts)}


def linear(ours: str, theirs: str, bias: bool = True, transposed: bool = False,
           ) -> list[TensorMap]:
    """The maps of a linear layer (or a layer norm: weight and bias) called ours and theirs."""
    maps = [TensorMap(f"{ours}.weight", (f"{theirs}.weight",), transposed)]
    if bias:
        maps.append(TensorMap(f"{ours}.bias", (f"{theirs}.bias",)))
    return maps


def stacked(ours: str, theirs: tuple[str, ...]) -> list[TensorMap]:
    """The maps of a fused linear layer ours whose rows are the HF linear layers theirs."""
    return [TensorMap(f"{ours}.{kind}", tuple(f"{t}.{kind}" for t in theirs))
            for kind in ("weight", "bias")]


@dataclass
class Layout:
    """What a folder's model is in pygpt's terms: its config, the map of each tensor read from
    the folder, the folder's tensors read past (buffers, tied copies) and the prefixes of pygpt
    tensors the folder lacks, which stay as pygpt initialises them (a head added for
    fine-tuning)."""

    config: ModelConfig
    maps: list[TensorMap]
    ignored: set[str]
    fresh: tuple[str, ...] = ()


def setting(hf: Mapping[str, Any], name: str, default: Any, kind: type,
            source: str = "config.json") -> Any:
    """The value of name in an HF config.json (default when absent), checked to be of kind;
    source names the file in the error (another JSON file of the folder: tokenizer_config.json)."""
    value = hf.get(name, default)
    ok = (isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
          or value is None and default is None
          or kind is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        raise ValueError(f"{source}: {name} must be {kind.__name__}, got {reprlib.repr(value)}")
    return value


def check_architectures(hf: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """A ValueError naming the first of config.json's architectures that is not one of known."""
    unknown = [a for a in setting(hf, "architectures", None, list) or [] if a not in known]
    if unknown:
        raise ValueError(f"config.json: architectures {unknown[0]} is not converted (pygpt "
                         f"converts {', '.join(known)})")


def refuse(what: str, reasons: list[str]) -> None:
    """One ValueError listing every option (reasons) that stops the conversion of what."""
    if reasons:
        raise ValueError(f"cannot convert {what}: {'; '.join(reasons)}")


def layer_size_reasons(cfg: ModelConfig) -> list[str]:
    """Why Hugging Face's GPT-2 and BERT cannot hold cfg's layers: theirs all have one head
    count and one MLP width (a globally pruned model's differ)."""
    return [f"{name} is set (Hugging Face's layers all have one {what})"
            for name, what in (("layer_heads", "head count"), ("layer_mlp_dims", "MLP width"))
            if getattr(cfg, name)]


def head_width_reasons(cfg: ModelConfig) -> list[str]:
    """Why Hugging Face's GPT-2 and BERT cannot hold cfg's heads: theirs are n_embd / n_head
    wide, queries, keys and values alike (a pruned model's keep their width as n_head falls)."""
    usual = cfg.n_embd // cfg.n_head if cfg.n_embd % cfg.n_head == 0 else None
    return [f"{name} is {getattr(cfg, name)} (Hugging Face's heads are n_embd / n_head"
            + (f" = {usual}" if usual else f", and {cfg.n_embd} / {cfg.n_head} is no whole number")
            + " wide)" for name in ("qk_dim", "v_dim") if getattr(cfg, name) not in (0, usual)]
