"""An export folder's runner.json: reading it, and checking that every field the runner reads
has the type and range the exporter writes (the fields of its family: families.py), so that a
damaged or hand-edited file is one `error:` line naming the field instead of a traceback deep in
the runner (torch-free, beside onnx_text.py)."""
from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Optional

from pygpt_runtime.json_file import read_json
from pygpt_runtime.families import FAMILIES, Check, count, plain_name

RUNNER_CONFIG = "runner.json"  # the export's config (named in pygpt.storage.run_files; no pygpt)
# The key of a graph's metadata that records the positions it holds (pygpt.onnx.graph.to_onnx
# writes it; exports made before lack it): runner.json's block_size may not exceed it.
GRAPH_BLOCK_SIZE = "pygpt.block_size"
# The largest block_size a runner.json may name where its graph records none.
MAX_BLOCK_SIZE = 1 << 20
# The fields of every export's runner.json.
COMMON: dict[str, Check] = {
    "tokenizer": (lambda v: isinstance(v, dict) and isinstance(v.get("kind"), str)
                  and plain_name(v.get("file")), "an object naming its kind and a file of the "
                                                 "folder"),
    "block_size": (lambda v: count(v) and v <= MAX_BLOCK_SIZE,
                   f"a positive count of at most {MAX_BLOCK_SIZE}")}


def export_files(config: dict) -> list[str]:
    """The files a checked runner.json names: each graph of each variant and the tokenizer."""
    graphs = [g for f in config["models"].values()
              for g in (f.values() if isinstance(f, dict) else [f])]
    return [*graphs, config["tokenizer"]["file"]]


def _read(folder: Path) -> tuple[dict, Path]:
    """An export folder's runner.json, and its path: a JSON object naming a family of the table
    ("gpt" where it names none), else a one-line error; its other fields unchecked."""
    config_path = folder / RUNNER_CONFIG
    if not config_path.exists():
        raise FileNotFoundError(f"{folder} has no {RUNNER_CONFIG}: not a pygpt ONNX "
                                "export (or one made before it was named so: export again)")
    try:
        config = {"family": "gpt", **read_json(config_path)}
    except ValueError as e:  # not UTF-8, nor JSON
        raise ValueError(f"{e}: export again") from None
    except TypeError:  # JSON, but no object
        raise ValueError(f"{config_path} is not a JSON object: export again") from None
    if not isinstance(config["family"], str) or config["family"] not in FAMILIES:
        raise ValueError(f"{config_path}: family must be {', '.join(FAMILIES)}, got "
                         f"{reprlib.repr(config['family'])}: export again")
    return config, config_path


def read_family(folder: Path) -> str:
    """The family an export folder's runner.json names (its other fields are its family's
    runner's to check and report)."""
    return _read(folder)[0]["family"]


def read_config(folder: Path, family: Optional[str] = None, refusal: str = "") -> dict:
    """An export folder's runner.json; its "family" is "gpt" in exports made before BERT's, its
    "task" the family's only one where it names none. A ValueError names the file and the field
    when it is not a JSON object with the fields the runner reads, of their types; with family,
    one that says "{folder} holds a ... model" and then refusal when the export is of another
    family."""
    config, config_path = _read(folder)
    if family is not None and config["family"] != family:
        raise ValueError(f"{folder} holds a {config['family']} model{refusal}")
    of = FAMILIES[config["family"]]
    if of.default_task() is not None:
        config.setdefault("task", of.default_task())
    for key, source in of.defaults.items():
        config.setdefault(key, config.get(source))
    tasks = tuple(of.tasks)
    checks = {**COMMON, **of.fields, "task": (lambda v: v in tasks,
                                              " or ".join(f'"{t}"' for t in tasks))}
    if config.get("task") in tasks:
        checks.update(of.tasks[config["task"]].fields)
    missing = [k for k in checks if k not in config]
    if missing:
        raise ValueError(f"{config_path} lacks {', '.join(missing)}: export again")
    for key, (ok, what) in checks.items():
        if not ok(config[key]):
            raise ValueError(f"{config_path}: {key} must be {what}, got "
                             f"{reprlib.repr(config[key])}: export again")
    if of.check is not None:
        of.check(config, config_path)
    return config


def check_block_size(config: dict, graph: Path, metadata: dict[str, str]) -> None:
    """A ValueError unless the block_size of the checked runner.json config is at most the
    positions its graph records (metadata: the graph file's, GRAPH_BLOCK_SIZE); a graph that
    records none (an export made before) is held to MAX_BLOCK_SIZE alone."""
    held = metadata.get(GRAPH_BLOCK_SIZE)
    if held is None:
        return
    if not re.fullmatch("[0-9]{1,18}", held) or config["block_size"] > int(held):
        raise ValueError(f"{graph} holds {reprlib.repr(held)} positions but its {RUNNER_CONFIG}'s "
                         f"block_size is {config['block_size']}: export again")


def past_heads(config: dict, past_name: str) -> int:
    """The attention heads of the layer of a past input (past_key_values.{i}.key / .value) of
    a checked GPT runner.json: layer_heads[i] where layers differ, else n_head."""
    if "layer_heads" not in config:
        return config["n_head"]
    return config["layer_heads"][int(past_name.split(".")[1])]


def takes_lengths(config: dict) -> bool:
    """Whether a checked GPT runner.json's graph takes each row's lengths (format 2)."""
    return config.get("format", 1) >= 2
