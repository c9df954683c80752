"""Checkpoints: a folder holding config.json (model and training settings), tokenizer.json,
model.safetensors (the weights: plain tensors, safe to load from strangers) and, for --resume,
train_state.pt (optimizer, step, RNG states: tensors and numbers only, loaded with
torch.load(weights_only=True), which never unpickles arbitrary objects). Every file is written
atomically, and all three record their step, so files left inconsistent by a kill between two
writes are detected instead of loaded.

The model is rebuilt from its config by pygpt.models.build (the config's `arch` picks the
family). Format 1 checkpoints (written before the models were assembled from pygpt.nn) name the
GPT's embedding weights differently; they load through LEGACY_NAMES."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

from pygpt.config import ModelConfig, TrainConfig, config_from_dict, to_dict
from pygpt.io import atomic_write, atomic_write_text
from pygpt.models import build
from pygpt.run_files import CONFIG, LABELS, TOKENIZER, TRAIN_STATE, WEIGHTS
from pygpt.tokenizer import Tokenizer, load_tokenizer

FORMAT = 2
READABLE_FORMATS = (1, 2)
# Format 1 weight names -> today's (prefixes).
LEGACY_NAMES = {"tok_emb.": "embed.tok.", "pos_emb.": "embed.pos.", "embed_norm.": "embed.norm."}


def save(out_dir: Union[str, Path], model: nn.Module, tokenizer: Tokenizer,
         train_cfg: Optional[TrainConfig] = None, state: Optional[dict[str, Any]] = None,
         step: int = 0, labels: Optional[Sequence[str]] = None) -> None:
    """Writes the checkpoint files into out_dir (created if needed), with a classifier's labels
    (its class names, in the order of its outputs). The weights go first and carry their own
    model config and step, so a kill before the other files are rewritten leaves weights that
    still load (see load)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if labels is not None:  # never change between steps: first, with the weights still older
        atomic_write_text(out / LABELS, json.dumps(list(labels), ensure_ascii=False))
    model_cfg = to_dict(model.config)
    metadata = {"format": str(FORMAT), "step": str(step), "model_config": json.dumps(model_cfg)}
    atomic_write(out / WEIGHTS, lambda tmp: save_model(model, str(tmp), metadata=metadata))
    if state is not None:
        atomic_write(out / TRAIN_STATE, lambda tmp: torch.save({**state, "step": step}, tmp))
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


def _read_json(path: Path, missing: str) -> Any:
    """The JSON in path; FileNotFoundError(missing) if there is none, ValueError if corrupt."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(missing) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is corrupt: {e}") from None


def read_config(ckpt: Union[str, Path]) -> dict[str, Any]:
    path = Path(ckpt)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {path}")
    config = _read_json(path / CONFIG, f"{path} is not a checkpoint: it has no {CONFIG}")
    if (not isinstance(config, dict) or config.get("format") not in READABLE_FORMATS
            or "model" not in config):
        raise ValueError(f"{path / CONFIG} is not a pygpt checkpoint config (format "
                         f"{' or '.join(map(str, READABLE_FORMATS))})")
    return config


def load(ckpt: Union[str, Path], kernels: str = "ext",
         device: Union[str, torch.device] = "cpu") -> tuple[nn.Module, Tokenizer]:
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
    weights_format = meta.get("format", "1")  # format 1 weights did not record it
    if weights_format not in {str(f) for f in READABLE_FORMATS}:
        raise ValueError(f"{weights} is in weights format {weights_format!r}; this pygpt reads "
                         f"format {' or '.join(map(str, READABLE_FORMATS))}")
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
    model = build(model_cfg, kernels=kernels)
    try:
        state = load_file(str(weights), device=str(device))
        if weights_format == "1":
            state = {_legacy_name(name): t for name, t in state.items()}
        _load_weights(model, state, weights)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise ValueError(f"{weights} is truncated, corrupt or does not match {CONFIG}: {e}") from None
    return model.to(device).eval(), tokenizer


def _legacy_name(name: str) -> str:
    for old, new in LEGACY_NAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Loads every tensor of the model from state; a tensor the model shares between two names
    (a tied head) is saved under one of them, and that suffices."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {own[name].data_ptr() for name in state if name in own}
    missing = [name for name in missing if own[name].data_ptr() not in loaded]
    if missing or unexpected:
        raise ValueError(f"{source} does not match {CONFIG}: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")


def load_labels(ckpt: Union[str, Path]) -> Optional[list[str]]:
    """A classifier checkpoint's class names, in the order of its outputs; None for a model
    without a classification head. A ValueError if they do not fit the model's num_labels."""
    path = Path(ckpt)
    num_labels = read_config(path)["model"].get("num_labels", 0)
    if not num_labels:
        return None
    labels = _read_json(path / LABELS, f"{path} holds a classifier but no {LABELS}")
    if (not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
            or len(labels) != num_labels):
        raise ValueError(f"{path / LABELS} must be a list of the model's {num_labels} label "
                         f"names, got {labels!r}")
    return labels


def init_from(model: nn.Module, source: nn.Module, fresh: Sequence[str] = ()) -> None:
    """Loads source's weights into model (fine-tuning): every tensor of model must come from a
    tensor of source of the same shape, except those under the prefixes in `fresh` (a new head,
    left as model initialised it); source's own tensors under those prefixes are dropped, and
    any other tensor of source that model lacks is an error."""
    def is_fresh(name: str) -> bool:
        return any(name.startswith(prefix) for prefix in fresh)

    state = {name: t for name, t in source.state_dict().items() if not is_fresh(name)}
    own = model.state_dict()
    wrong = [f"{name} {tuple(t.shape)} (here {tuple(own[name].shape)})"
             for name, t in state.items() if name in own and own[name].shape != t.shape]
    if wrong:
        raise ValueError(f"the source's weights do not fit this model: {', '.join(wrong)}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not is_fresh(name)]
    if missing or unexpected:
        raise ValueError(f"the source's weights do not fit this model: missing {sorted(missing)},"
                         f" unexpected {sorted(unexpected)}")


def weights_step(ckpt: Union[str, Path]) -> int:
    return int(_weights_metadata(Path(ckpt) / WEIGHTS).get("step", -1))


def load_train_state(ckpt: Union[str, Path]) -> dict[str, Any]:
    """The training state saved for --resume, checked to be from the same step as the weights."""
    path = Path(ckpt) / TRAIN_STATE
    if not path.exists():
        raise FileNotFoundError(f"{path.parent} has no {TRAIN_STATE}: nothing to resume")
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises several types for damaged files
        raise ValueError(f"{path} is truncated or corrupt: {e}") from None
    step = weights_step(path.parent)
    if state.get("step") != step:
        raise ValueError(f"{path.parent}: the training state is from step {state.get('step')} but "
                         f"the weights from step {step} (a save was interrupted); cannot resume")
    return state
