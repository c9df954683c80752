"""An export folder's runner.json: reading it, and checking that every field the runner reads
has the type and range the exporter writes, so that a damaged or hand-edited file is one
`error:` line naming the field instead of a traceback deep in the runner (torch-free, beside
onnx_text.py)."""
from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any, Callable, Optional

RUNNER_CONFIG = "runner.json"  # the export's config (named in pygpt.storage.run_files; no pygpt)
FAMILIES = ("gpt", "bert", "seq2seq")
TRANSLATOR_PARTS = ("encoder", "decoder", "decoder_with_past")
# A GPT graph of format 2 takes these besides input_ids and the past (right-padded rows of
# different lengths in one call); one of format 1 (exports made before) does not.
GPT_FORMATS = (1, 2)
LENGTH_INPUTS = ("input_lengths", "past_lengths")


def _count(v: Any) -> bool:
    return type(v) is int and v >= 1


def _names(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v)


def plain_name(v: Any) -> bool:
    """Whether v names a file of the export folder itself: no path (absolute, "..", a separator)
    nor hidden name, so that a runner.json from elsewhere reads nothing outside its folder."""
    return (isinstance(v, str) and v not in ("", ".", "..") and not v.startswith(".")
            and not any(c in v for c in ("/", "\\", "\0", ":")))


def _files(v: Any, parts: bool) -> bool:
    """A "models" entry: variant -> graph file, or (a translator) variant -> part -> file."""
    def file(f: Any) -> bool:
        return (isinstance(f, dict) and set(f) == set(TRANSLATOR_PARTS)
                and all(plain_name(x) for x in f.values())) if parts else plain_name(f)
    return isinstance(v, dict) and "fp32" in v and all(file(f) for f in v.values())


def export_files(config: dict) -> list[str]:
    """The files a checked runner.json names: each graph of each variant and the tokenizer."""
    graphs = [g for f in config["models"].values()
              for g in (f.values() if isinstance(f, dict) else [f])]
    return [*graphs, config["tokenizer"]["file"]]


def _ids(v: Any) -> bool:
    return isinstance(v, dict) and all(type(i) is int and i >= 0 for i in v.values())


Check = tuple[Callable[[Any], bool], str]
_TOKENIZER: Check = (lambda v: isinstance(v, dict) and isinstance(v.get("kind"), str)
                     and plain_name(v.get("file")), "an object naming its kind and a file of "
                                                     "the folder")
FIELDS: dict[str, dict[str, Check]] = {
    "gpt": {"models": (lambda v: _files(v, False),
                       "a graph file of the folder per variant (fp32, int8)"),
            "n_head": (_count, "a positive count"), "head_dim": (_count, "a positive count"),
            "window_keep": (_count, "a positive count"),
            "inputs": (_names, "the graph's input names")},
    "bert": {"models": (lambda v: _files(v, False),
                        "a graph file of the folder per variant (fp32, int8)"),
             "task": (lambda v: v in ("fill-mask", "classify"), '"fill-mask" or "classify"')},
    "seq2seq": {"models": (lambda v: _files(v, True), "per variant, a file of the folder for "
                           "each of " + ", ".join(TRANSLATOR_PARTS)),
                "special_tokens": (_ids, "an object of token ids"),
                "io": (lambda v: isinstance(v, dict) and all(
                    isinstance(v.get(part), list) and len(v[part]) == 2
                    and all(_names(n) for n in v[part]) for part in TRANSLATOR_PARTS),
                       "each graph's input and output names")},
}


def read_config(folder: Path, family: Optional[str] = None, refusal: str = "") -> dict:
    """An export folder's runner.json; its "family" is "gpt" in exports made before BERT's. A
    ValueError names the file and the field when it is not a JSON object with the fields the
    runner reads, of their types; with family, one that says "{folder} holds a ... model" and
    then refusal when the export is of another family."""
    config_path = folder / RUNNER_CONFIG
    if not config_path.exists():
        raise FileNotFoundError(f"{folder} has no {RUNNER_CONFIG}: not a pygpt ONNX "
                                "export (or one made before it was named so: export again)")
    try:
        config = {"family": "gpt", **json.loads(config_path.read_text(encoding="utf-8"))}
    except (ValueError, TypeError) as e:  # not UTF-8, not JSON, or JSON but no object
        raise ValueError(f"{config_path} is damaged ({e}): export again") from None
    if config["family"] not in FAMILIES:
        raise ValueError(f"{config_path}: family must be {', '.join(FAMILIES)}, got "
                         f"{reprlib.repr(config['family'])}: export again")
    if family is not None and config["family"] != family:
        raise ValueError(f"{folder} holds a {config['family']} model{refusal}")
    family = config["family"]
    checks: dict[str, Check] = {"tokenizer": _TOKENIZER,
                                "block_size": (_count, "a positive count"), **FIELDS[family]}
    if family == "gpt":  # a GPT's values as wide as its keys (head_dim) unless it says otherwise
        config.setdefault("v_head_dim", config.get("head_dim"))
        checks["v_head_dim"] = (_count, "a positive count")
    if family == "bert" and config.get("task") == "classify":
        checks["labels"] = (_names, "the list of the classifier's label names")
    missing = [k for k in checks if k not in config]
    if missing:
        raise ValueError(f"{config_path} lacks {', '.join(missing)}: export again")
    for key, (ok, what) in checks.items():
        if not ok(config[key]):
            raise ValueError(f"{config_path}: {key} must be {what}, got "
                             f"{reprlib.repr(config[key])}: export again")
    if family == "gpt" and config["window_keep"] > config["block_size"]:
        raise ValueError(f"{config_path}: window_keep {config['window_keep']} exceeds "
                         f"block_size {config['block_size']}: export again")
    if family == "gpt":
        _check_gpt_format(config, config_path)
        _check_layer_heads(config, config_path)
    return config


def _past_layers(config: dict) -> list[str]:
    """The layers (their index as the graph's past inputs write it) of a GPT's runner.json."""
    return [n.split(".")[1] for n in config["inputs"]
            if n.startswith("past_key_values.") and n.endswith(".key")]


def _check_layer_heads(config: dict, config_path: Path) -> None:
    """A GPT's layer_heads, when there (layers of different head counts), holds a head count
    of 1 to n_head for each layer of the graph's past, whose inputs are named by index."""
    if "layer_heads" not in config:
        return
    layers, heads = _past_layers(config), config["layer_heads"]
    if layers != [str(i) for i in range(len(layers))]:
        raise ValueError(f"{config_path}: the past inputs must be past_key_values.0 .. "
                         f"{len(layers) - 1}, in order: export again")
    if not (isinstance(heads, list) and len(heads) == len(layers)
            and all(_count(h) and h <= config["n_head"] for h in heads)):
        raise ValueError(f"{config_path}: layer_heads must hold a head count of 1 to n_head "
                         f"({config['n_head']}) for each of its {len(layers)} layers, got "
                         f"{reprlib.repr(heads)}: export again")


def past_heads(config: dict, past_name: str) -> int:
    """The attention heads of the layer of a past input (past_key_values.{i}.key / .value) of
    a checked GPT runner.json: layer_heads[i] where layers differ, else n_head."""
    if "layer_heads" not in config:
        return config["n_head"]
    return config["layer_heads"][int(past_name.split(".")[1])]


def _check_gpt_format(config: dict, config_path: Path) -> None:
    """A GPT's format (absent: 1) is one this runner knows, and its graph's inputs are that
    format's: the length inputs from format 2 on, none before."""
    form = config.get("format", 1)
    if type(form) is not int or form not in GPT_FORMATS:
        raise ValueError(f"{config_path}: format must be one of "
                         f"{', '.join(map(str, GPT_FORMATS))}, got {reprlib.repr(form)} (an "
                         "export of a later pygpt? update pygpt_runtime)")
    has = [name in config["inputs"] for name in LENGTH_INPUTS]
    if all(has) != (form >= 2) or any(has) != all(has):
        raise ValueError(f"{config_path}: a format {form} graph takes "
                         f"{'the' if form >= 2 else 'no'} inputs {', '.join(LENGTH_INPUTS)}: "
                         "export again")


def takes_lengths(config: dict) -> bool:
    """Whether a checked GPT runner.json's graph takes each row's lengths (format 2)."""
    return config.get("format", 1) >= 2
