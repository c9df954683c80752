"""Checkpoints: a folder holding config.json (model and training settings), tokenizer.json,
model.safetensors (the weights: plain tensors, safe to load from strangers) and, for --resume,
train_state.pt (optimizer, step, RNG states: tensors and numbers only, loaded with
torch.load(weights_only=True), which never unpickles arbitrary objects). Every file is written
atomically, and all three record their step, so files left inconsistent by a kill between two
writes are detected instead of loaded."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from pygpt.config import ModelConfig, TrainConfig, config_from_dict, to_dict
from pygpt.io import atomic_write, atomic_write_text
from pygpt.model import GPT
from pygpt.tokenizer import CharTokenizer, load_tokenizer

CONFIG, TOKENIZER, WEIGHTS, STATE = "config.json", "tokenizer.json", "model.safetensors", "train_state.pt"
FORMAT = 1


def save(out_dir: Union[str, Path], model: GPT, tokenizer: CharTokenizer,
         train_cfg: Optional[TrainConfig] = None, state: Optional[dict[str, Any]] = None,
         step: int = 0) -> None:
    """Writes the checkpoint files into out_dir (created if needed). The weights go first and
    carry their own model config and step, so a kill before the other files are rewritten leaves
    weights that still load (see load)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_cfg = to_dict(model.config)
    metadata = {"step": str(step), "model_config": json.dumps(model_cfg)}
    atomic_write(out / WEIGHTS, lambda tmp: save_model(model, str(tmp), metadata=metadata))
    if state is not None:
        atomic_write(out / STATE, lambda tmp: torch.save({**state, "step": step}, tmp))
    tokenizer.save(out / TOKENIZER)
    config = {"format": FORMAT, "step": step, "model": model_cfg,
              "train": to_dict(train_cfg) if train_cfg is not None else None}
    atomic_write_text(out / CONFIG, json.dumps(config, indent=2))


def _weights_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} is truncated, corrupt or not a safetensors file: {e}") from None


def read_config(ckpt: Union[str, Path]) -> dict[str, Any]:
    path = Path(ckpt)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {path}")
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is not a checkpoint: it has no {CONFIG}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / CONFIG} is corrupt: {e}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT or "model" not in config:
        raise ValueError(f"{path / CONFIG} is not a pygpt checkpoint config (format {FORMAT})")
    return config


def load(ckpt: Union[str, Path], kernels: str = "ext",
         device: Union[str, torch.device] = "cpu") -> tuple[GPT, CharTokenizer]:
    """The model (in eval mode) and tokenizer saved in the folder ckpt.

    The weights file records the model config and step it was saved with. If config.json is
    from another step, a save was interrupted after the weights were written: the weights are
    the newest complete state and load with their own config. If both are from the same step
    but describe different models, the folder was tampered with or mixed up: an error."""
    path = Path(ckpt)
    config = read_config(path)
    weights = path / WEIGHTS
    if not weights.exists():
        raise FileNotFoundError(f"{path} has no weights file {WEIGHTS}")
    meta = _weights_metadata(weights)
    try:
        model_cfg: ModelConfig = config_from_dict(ModelConfig, config["model"])
        weights_cfg = (config_from_dict(ModelConfig, json.loads(meta["model_config"]))
                       if "model_config" in meta else model_cfg)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path / CONFIG}: invalid model config: {e}") from None
    if str(config.get("step")) != meta.get("step"):
        model_cfg = weights_cfg  # an interrupted save: the weights are the newest whole state
    elif weights_cfg != model_cfg:
        differences = ", ".join(
            f"{k} is {v!r} there but {getattr(weights_cfg, k)!r} in the weights"
            for k, v in to_dict(model_cfg).items() if getattr(weights_cfg, k) != v)
        raise ValueError(f"{weights} does not match {CONFIG}: {differences}")
    tokenizer = load_tokenizer(path / TOKENIZER)
    if tokenizer.vocab_size != model_cfg.vocab_size:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model "
                         f"was configured for {model_cfg.vocab_size}")
    model = GPT(model_cfg, kernels=kernels)
    try:
        missing, unexpected = load_model(model, str(weights), strict=False, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as e:
        raise ValueError(f"{weights} is truncated, corrupt or does not match {CONFIG}: {e}") from None
    if missing or unexpected:
        raise ValueError(f"{weights} does not match {CONFIG}: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    return model.to(device).eval(), tokenizer


def weights_step(ckpt: Union[str, Path]) -> int:
    return int(_weights_metadata(Path(ckpt) / WEIGHTS).get("step", -1))


def load_train_state(ckpt: Union[str, Path]) -> dict[str, Any]:
    """The training state saved for --resume, checked to be from the same step as the weights."""
    path = Path(ckpt) / STATE
    if not path.exists():
        raise FileNotFoundError(f"{path.parent} has no {STATE}: nothing to resume")
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises several types for damaged files
        raise ValueError(f"{path} is truncated or corrupt: {e}") from None
    step = weights_step(path.parent)
    if state.get("step") != step:
        raise ValueError(f"{path.parent}: the training state is from step {state.get('step')} but "
                         f"the weights from step {step} (a save was interrupted); cannot resume")
    return state
