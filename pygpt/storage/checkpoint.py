"""Checkpoints: a folder holding config.json (model and training settings), tokenizer.json,
model.safetensors (the weights: plain tensors, safe to load from strangers) and, for --resume,
train_state.pt (optimizer, step, RNG states: tensors and numbers only, loaded with
torch.load(weights_only=True), which never unpickles arbitrary objects).

A save changes the folder as a whole (pygpt.storage.atomic.FolderWrite): a kill at any moment leaves the
previous checkpoint or the new one, never a mix. `recover(out)` finishes or discards a save that
a kill cut short; `save` calls it first, and every reader here reads the committed files without
writing (pygpt.storage.atomic.read_committed). All three files record their step, so files of different
saves side by side (copied or edited by hand) are a clear error, never loaded together.

The model is rebuilt from its config by pygpt.families.build (the config's `arch` picks the
family). Weights of older layouts (format 1; attention before its projections were fused) are
rewritten by pygpt.storage.compat before they load."""
from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from pygpt.storage.compat import upgrade_config, upgrade_model, upgrade_weights
from pygpt.config import ModelConfig, TrainConfig
from pygpt.config.fields import config_from_dict, to_dict
from pygpt.data.labelled import check_labels
from pygpt.storage.atomic import FolderWrite, read_committed, recover_folder
from pygpt.families import build
from pygpt.storage.run_files import CONFIG, LABELS, TOKENIZER, TRAIN_STATE, WEIGHTS
from pygpt.storage.serializers import save_weights, torch_save
from pygpt.tokenizer import Tokenizer, load_tokenizer
from pygpt_runtime.json_file import parse_json, read_json
from pygpt_runtime.text import check_ids
from pygpt.storage.train_state import check_train_state, load_optimizer

FORMAT = 3
READABLE_FORMATS = (1, 2, 3)  # older ones through pygpt.storage.compat
_READABLE = ", ".join(map(str, READABLE_FORMATS[:-1])) + f" or {READABLE_FORMATS[-1]}"
_READS = 3  # reads of files that a save committed in between left from different saves


def recover(out: Union[str, Path]) -> None:
    """Finishes a save that a kill cut short after its commit, or discards one cut before."""
    recover_folder(out)


def save(out_dir: Union[str, Path], model: nn.Module, tokenizer: Tokenizer,
         train_cfg: Optional[TrainConfig] = None, state: Optional[dict[str, Any]] = None,
         step: int = 0, labels: Optional[Sequence[str]] = None,
         remove: Sequence[str] = ()) -> None:
    """Writes the checkpoint into out_dir (created if needed) as a whole, with a classifier's
    labels (its class names, in the order of its outputs). A train_state.pt or labels.json of
    the previous checkpoint that this one lacks is removed with the rest, and so are the files
    named in `remove` that it does not write (an earlier run's, which the first save of a new
    run replaces: pygpt.train --overwrite)."""
    model_cfg = to_dict(model.config)
    metadata = {"format": str(FORMAT), "step": str(step), "model_config": json.dumps(model_cfg)}
    config = {"format": FORMAT, "step": step, "model": model_cfg,
              "train": to_dict(train_cfg) if train_cfg is not None else None}

    def text(content: str) -> Callable[[Path], None]:
        return lambda path: path.write_text(content, encoding="utf-8")

    with FolderWrite(out_dir, index=CONFIG, remove=[LABELS, TRAIN_STATE, *remove]) as change:
        if labels is not None:
            change.write(LABELS, text(json.dumps(list(labels), ensure_ascii=False)))
        change.write(WEIGHTS, lambda path: save_weights(model, path, metadata))
        if state is not None:
            change.write(TRAIN_STATE, lambda path: torch_save({**state, "step": step}, path))
        change.write(TOKENIZER, text(tokenizer.to_json()))
        change.write(CONFIG, text(json.dumps(config, indent=2)))


def _read_json(ckpt: Path, name: str, missing: str) -> Any:
    """The JSON in the file `name` of ckpt; FileNotFoundError(missing), ValueError if corrupt."""
    return read_committed(ckpt, name, read_json, missing)


def _read_weights(ckpt: Path, tensors: bool = True, device: Union[str, torch.device] = "cpu",
                  ) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and (with `tensors`) the tensors of the weights file, from one open file."""
    def read(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                return (f.metadata() or {},
                        {name: f.get_tensor(name) for name in f.keys()} if tensors else {})
        except FileNotFoundError:
            raise
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"{path} is truncated, corrupt or not a safetensors file: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    return read_committed(ckpt, WEIGHTS, read, f"{ckpt} has no weights file {WEIGHTS}")


def read_config(ckpt: Union[str, Path]) -> dict[str, Any]:
    path = Path(ckpt)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {path}")
    config = _read_json(path, CONFIG, f"{path} is not a checkpoint: it has no {CONFIG}")
    if (not isinstance(config, dict) or config.get("format") not in READABLE_FORMATS
            or "model" not in config):
        raise ValueError(f"{path / CONFIG} is not a pygpt checkpoint config (format "
                         f"{_READABLE})")
    return upgrade_config(config)


def read_tokenizer(ckpt: Union[str, Path]) -> Tokenizer:
    """The tokenizer saved in the checkpoint folder ckpt (for a run resumed or fine-tuned)."""
    path = Path(ckpt) / TOKENIZER
    return read_committed(ckpt, TOKENIZER, load_tokenizer, f"no tokenizer at {path}")


def _mixed(path: Path, what: str, step: Any, weights_step: Any) -> ValueError:
    return ValueError(f"{path}: {what} is from step {step} but the weights from step "
                      f"{weights_step}: files of different saves (copied or edited by hand)")


def load(ckpt: Union[str, Path], kernels: str = "ext",
         device: Union[str, torch.device] = "cpu") -> tuple[nn.Module, Tokenizer]:
    """The model (in eval mode) and tokenizer saved in the folder ckpt. The weights record the
    model config and step they were saved with: a config.json of another step or model is an
    error (files of different saves), never loaded together."""
    path = Path(ckpt)
    read_config(path)  # a folder that is no checkpoint is named as such before anything else
    for _ in range(_READS):
        meta, state = _read_weights(path, device=device)
        config = read_config(path)  # read after the weights: of their save, or a newer one
        if str(config.get("step")) == meta.get("step"):
            break
    weights = path / WEIGHTS
    weights_format = meta.get("format", "1")  # format 1 weights did not record it
    if weights_format not in {str(f) for f in READABLE_FORMATS}:
        raise ValueError(f"{weights} is in weights format {weights_format!r}; this pygpt reads "
                         f"format {_READABLE}")
    recorded = (parse_json(meta["model_config"], f"{weights}'s model_config")
                if "model_config" in meta else None)
    try:
        model_cfg: ModelConfig = config_from_dict(ModelConfig, config["model"])
        weights_cfg = (config_from_dict(ModelConfig, upgrade_model(recorded))
                       if recorded is not None else model_cfg)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path / CONFIG}: invalid model config: {e}") from None
    if str(config.get("step")) != meta.get("step"):
        raise _mixed(path, CONFIG, config.get("step"), meta.get("step"))
    if weights_cfg != model_cfg:
        differences = ", ".join(
            f"{k} is {v!r} there but {getattr(weights_cfg, k)!r} in the weights"
            for k, v in to_dict(model_cfg).items() if getattr(weights_cfg, k) != v)
        raise ValueError(f"{weights} does not match {CONFIG}: {differences}")
    tokenizer = read_tokenizer(path)
    if tokenizer.vocab_size != model_cfg.vocab_size:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model "
                         f"was configured for {model_cfg.vocab_size}")
    check_ids(tokenizer, model_cfg.vocab_size, path / TOKENIZER)
    with torch.device("meta"):  # shapes only: the config checked to fit before any allocation
        shapes = build(model_cfg, kernels=kernels)
    state = upgrade_weights(shapes, state, weights_format)
    _check_fits(shapes, state, weights)
    model = build(model_cfg, kernels=kernels)
    model.load_state_dict(state, strict=False)
    return model.to(device).eval(), tokenizer


def _wrong_shapes(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> list[str]:
    """The tensors of state whose shape differs from the model's own tensor of that name."""
    return [f"{name} {tuple(t.shape)} (here {tuple(own[name].shape)})"
            for name, t in state.items() if name in own and own[name].shape != t.shape]


def _check_fits(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """A ValueError naming source unless state holds each tensor of the model (a shared one under
    one of its names), in its shape, in finite numbers; the model may be on the meta device."""
    own = model.state_dict(keep_vars=True)  # the tensors themselves: shared ones are one object
    wrong = _wrong_shapes(state, own)
    bad = sorted(n for n, t in state.items() if t.is_floating_point() and not t.isfinite().all())
    if wrong:
        raise ValueError(f"{source} does not match {CONFIG}: {', '.join(wrong)}")
    if bad:
        raise ValueError(f"{source} is damaged: {', '.join(bad)} hold(s) NaN or infinity")
    loaded = {id(own[name]) for name in state if name in own}
    missing = [name for name, t in own.items() if name not in state and id(t) not in loaded]
    unexpected = [name for name in state if name not in own]
    if missing or unexpected:
        raise ValueError(f"{source} does not match {CONFIG}: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")


def load_labels(ckpt: Union[str, Path]) -> Optional[list[str]]:
    """A classifier checkpoint's class names, in the order of its outputs; None for a model
    without a classification head. A ValueError if they do not fit the model's num_labels, repeat
    a name, or hold a control character (data.labelled.check_labels: they are printed)."""
    path = Path(ckpt)
    num_labels = read_config(path)["model"].get("num_labels", 0)
    if not num_labels:
        return None
    labels = _read_json(path, LABELS, f"{path} holds a classifier but no {LABELS}")
    if (not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
            or len(labels) != num_labels):
        raise ValueError(f"{path / LABELS} must be a list of the model's {num_labels} label "
                         f"names, got {reprlib.repr(labels)}")
    check_labels(labels, str(path / LABELS))
    return labels


def init_from(model: nn.Module, source: nn.Module, fresh: Sequence[str] = ()) -> None:
    """Loads source's weights into model (fine-tuning): every tensor of model must come from a
    tensor of source of the same shape, except those under the prefixes in `fresh` (a new head,
    left as model initialised it); source's own tensors under those prefixes are dropped, and
    any other tensor of source that model lacks is an error."""
    def is_fresh(name: str) -> bool:
        return any(name.startswith(prefix) for prefix in fresh)

    state = {name: t for name, t in source.state_dict().items() if not is_fresh(name)}
    wrong = _wrong_shapes(state, model.state_dict())
    if wrong:
        raise ValueError(f"the source's weights do not fit this model: {', '.join(wrong)}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not is_fresh(name)]
    if missing or unexpected:
        raise ValueError(f"the source's weights do not fit this model: missing {sorted(missing)},"
                         f" unexpected {sorted(unexpected)}")


def weights_step(ckpt: Union[str, Path]) -> int:
    return int(_read_weights(Path(ckpt), tensors=False)[0].get("step", -1))


def load_train_state(ckpt: Union[str, Path], optimizer: Optional[torch.optim.Optimizer] = None,
                     adapt: Callable[[dict], dict] = lambda saved: saved) -> dict[str, Any]:
    """The training state saved for --resume, checked to be from the same step as the weights
    and to hold what resuming reads; with `optimizer`, its state (as `adapt` rewrites it, e.g.
    from an older layout of the parameters) is loaded into it, checked to fit them first."""
    path = Path(ckpt)

    def read(file: Path) -> Any:
        try:
            return torch.load(file, weights_only=True)
        except FileNotFoundError:
            raise
        except Exception:  # torch raises several types; its words advise unsafe loading
            raise ValueError(f"{file} is truncated or corrupt, or holds Python objects (never "
                             "loaded: they could run code)") from None

    for _ in range(_READS):
        state = read_committed(path, TRAIN_STATE, read,
                               f"{path} has no {TRAIN_STATE}: nothing to resume")
        step = weights_step(path)  # read after the state: of its save, or a newer one
        if isinstance(state, dict) and state.get("step") == step:
            break
    check_train_state(state, path / TRAIN_STATE)
    if state["step"] != step:
        raise _mixed(path, "the training state", state["step"], step)
    if optimizer is not None:
        load_optimizer(optimizer, adapt(state["optimizer"]), path / TRAIN_STATE)
    return state
