"""How a config dataclass's fields are declared (with their --help text and their tags: the
model families or the task they belong to, whether they name an input file), checked for type,
saved to config.json and read back: the machinery that pygpt.config's ModelConfig and
TrainConfig share, apart from what their fields mean.

The tags are the one place that says which settings belong to which family: config.json holds a
model's own family's fields only, setting another family's model field is refused here, and the
families refuse another family's or task's training flags from the tags
(pygpt.families.base.Family.refuse_foreign)."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Any, Optional, Union


def opt(default: Any, help: str, family: Union[None, str, tuple[str, ...]] = None,
        listed: Optional[tuple[str, ...]] = None,
        task: Union[None, str, tuple[str, ...]] = None, file: bool = False) -> Any:
    """A dataclass field with its --help text and tags. `family`: the model families (arch) the
    field applies to, if not every family has it; `task`: the training tasks it applies to;
    `file`: the field names an input file (made absolute when a run records it); `listed`: a
    field saved only where set (not at its default) but always by these families (whose
    config.json held it before: it stays so)."""
    families = (family,) if isinstance(family, str) else family
    tasks = (task,) if isinstance(task, str) else task
    return field(default=default, metadata={"help": help, "family": families, "listed": listed,
                                            "task": tasks, "file": file})


def families_of(f: dataclasses.Field) -> Optional[tuple[str, ...]]:
    """The families a field applies to (its tag), or None: every family."""
    return f.metadata["family"]


def applies(cls: type, name: str, arch: str) -> bool:
    """Whether field `name` of config class cls applies to the model family arch."""
    families = families_of(next(f for f in dataclasses.fields(cls) if f.name == name))
    return families is None or arch in families


def tagged(cls: type, tag: str) -> list[dataclasses.Field]:
    """The fields of cls that carry tag ("family", "task" or "file")."""
    return [f for f in dataclasses.fields(cls) if f.metadata[tag]]


def check_field_types(cfg: Any) -> None:
    """Raises ValueError for a field whose value has the wrong type (say, from a hand-edited
    config.json): a float width, a string for a switch. An int is accepted where a float is due."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, hint = getattr(cfg, f.name), hints[f.name]
        args = typing.get_args(hint)
        if typing.get_origin(hint) is typing.Union and type(None) in args:
            if value is None:
                continue
            hint = next(a for a in args if a is not type(None))
        if typing.get_origin(hint) is typing.Literal:
            if value not in typing.get_args(hint):
                choices = " or ".join(repr(c) for c in typing.get_args(hint))
                raise ValueError(f"{f.name} must be {choices}, got {value!r}")
            continue
        elif hint is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif hint is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif typing.get_origin(hint) is tuple:  # tuple[int, ...]: sizes, one per layer
            ok = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in value)
            if not ok:
                raise ValueError(f"{f.name} must be a list of whole numbers, got {value!r}")
            continue
        else:
            ok = isinstance(value, hint)
        if not ok:
            raise ValueError(f"{f.name} must be {getattr(hint, '__name__', hint)}, got {value!r}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """cfg's fields as saved in config.json: a model config's only those of its family (and
    opt's `listed` ones only where set or listed); a training config's all of them."""
    arch = getattr(cfg, "arch", None)
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if (arch is None or families_of(f) is None or arch in families_of(f))
            and (f.metadata["listed"] is None or arch in f.metadata["listed"]
                 or getattr(cfg, f.name) != f.default)}


def config_from_dict(cls: type, d: Any) -> Any:
    """A ModelConfig or TrainConfig from its saved dict; a clear ValueError for anything else
    (unknown or missing keys, wrong types), e.g. a file from another version or hand-edited."""
    if not isinstance(d, dict):
        raise ValueError(f"expected the {cls.__name__} settings as a JSON object, got {d!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}")
    lists = {f.name for f in dataclasses.fields(cls) if isinstance(f.default, tuple)}
    return cls(**{k: tuple(v) if k in lists and isinstance(v, list) else v for k, v in d.items()})
