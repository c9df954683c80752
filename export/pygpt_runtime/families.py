"""The families the runtime runs, in one table (FAMILIES): for each, its runner class, its
pygpt-run entry, the kind of worker its server needs, its tasks and each task's routes, and what
its runner.json must hold. runner_config.read_config checks a runner.json by it, command.py
hands pygpt-run's command line to the family's entry, and the server (serve/served.py) opens the
family's runner, worker and routes by it (pygpt.serve.checkpoint wraps a checkpoint's torch
model by the same names). A new family is its runner module and one entry here.

The runners, entries and routes are named as "module:attribute" and imported only when used
(`load`): this module is imported wherever a runner.json is read (pygpt's exporter and training
too), so it imports nothing beyond the standard library: not onnxruntime or numpy (which the
runners need), nor FastAPI (the server is an extra, which pygpt-run must not need). The table
stays one table; each side imports only the parts it uses.

Here too are the checks a runner.json's fields are written with: a (predicate, what the value
must be) pair per field, and a GPT's checks between its fields."""
from __future__ import annotations

import importlib
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

Check = tuple[Callable[[Any], bool], str]
TRANSLATOR_PARTS = ("encoder", "decoder", "decoder_with_past")
# A GPT graph of format 2 takes these besides input_ids and the past (right-padded rows of
# different lengths in one call); one of format 1 (exports made before) does not.
GPT_FORMATS = (1, 2)
LENGTH_INPUTS = ("input_lengths", "past_lengths")
# A question answerer's labels: the names of its two logits a token (pygpt.tasks.qa saves them).
SPAN_LABELS = ["start", "end"]


def count(v: Any) -> bool:
    return type(v) is int and v >= 1


def names(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v)


def plain_name(v: Any) -> bool:
    """Whether v names a file of the export folder itself: no path (absolute, "..", a separator)
    nor hidden name, so that a runner.json from elsewhere reads nothing outside its folder."""
    return (isinstance(v, str) and v not in ("", ".", "..") and not v.startswith(".")
            and not any(c in v for c in ("/", "\\", "\0", ":")))


def _graph_files(parts: tuple[str, ...]) -> Check:
    """A "models" entry: variant -> graph file, or (parts given: a family of several graphs)
    variant -> part -> file."""
    def file(f: Any) -> bool:
        return (isinstance(f, dict) and set(f) == set(parts)
                and all(plain_name(x) for x in f.values())) if parts else plain_name(f)
    what = ("per variant, a file of the folder for each of " + ", ".join(parts) if parts
            else "a graph file of the folder per variant (fp32, int8)")
    return (lambda v: isinstance(v, dict) and "fp32" in v and all(file(f) for f in v.values()),
            what)


def _ids(v: Any) -> bool:
    return isinstance(v, dict) and all(type(i) is int and i >= 0 for i in v.values())


def _io(v: Any) -> bool:
    """A translator's graphs' input and output names, per part."""
    return isinstance(v, dict) and all(isinstance(v.get(part), list) and len(v[part]) == 2
                                       and all(names(n) for n in v[part])
                                       for part in TRANSLATOR_PARTS)


@dataclass(frozen=True)
class Task:
    """One task of a family (runner.json's "task"): its server routes, "module:function" of the
    served model (serve/served.py's Served) giving a FastAPI APIRouter; and the fields of
    runner.json it adds."""
    routes: str
    fields: dict[str, Check] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    name: str  # runner.json's "family", a pygpt config's arch
    runner: str  # its runner class, "module:Class", built as Class(folder, variant, threads)
    main: str  # its pygpt-run entry, "module:function", given the whole command line
    # Its server's worker: "rows" decodes every request's rows together, step by step (a
    # completion's tokens stream); "requests" runs one request whole at a time.
    worker: str
    tasks: dict[str, Task]  # by runner.json's "task"; a family of one task may leave it out
    fields: dict[str, Check]  # runner.json's fields it reads, and their checks
    # Fields that, when absent, take another field's value (field -> the other).
    defaults: dict[str, str] = field(default_factory=dict)
    # The checks between fields, after each field's own: (config, its path) -> a ValueError.
    check: Optional[Callable[[dict, Path], None]] = None
    names_model: bool = False  # its requests name the served model (OpenAI's "model" field)

    def default_task(self) -> Optional[str]:
        """The task of a runner.json that names none: the family's only one (None: it has
        several, and runner.json must say which)."""
        return next(iter(self.tasks)) if len(self.tasks) == 1 else None


def load(spec: str) -> Any:
    """What a "module:attribute" of the table names, imported now."""
    module, attribute = spec.split(":")
    return getattr(importlib.import_module(module), attribute)


def _past_layers(config: dict) -> list[str]:
    """The layers (their index as the graph's past inputs write it) of a GPT's runner.json."""
    return [n.split(".")[1] for n in config["inputs"]
            if n.startswith("past_key_values.") and n.endswith(".key")]


def _check_gpt(config: dict, config_path: Path) -> None:
    """A GPT's window_keep fits its context; its format (absent: 1) is one this runner knows,
    and its graph's inputs are that format's (the length inputs from format 2 on, none before);
    its layer_heads, when there (layers of different head counts), holds a head count of 1 to
    n_head for each layer of the graph's past, whose inputs are named by index."""
    if config["window_keep"] > config["block_size"]:
        raise ValueError(f"{config_path}: window_keep {config['window_keep']} exceeds "
                         f"block_size {config['block_size']}: export again")
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
    if "layer_heads" not in config:
        return
    layers, heads = _past_layers(config), config["layer_heads"]
    if layers != [str(i) for i in range(len(layers))]:
        raise ValueError(f"{config_path}: the past inputs must be past_key_values.0 .. "
                         f"{len(layers) - 1}, in order: export again")
    if not (isinstance(heads, list) and len(heads) == len(layers)
            and all(count(h) and h <= config["n_head"] for h in heads)):
        raise ValueError(f"{config_path}: layer_heads must hold a head count of 1 to n_head "
                         f"({config['n_head']}) for each of its {len(layers)} layers, got "
                         f"{reprlib.repr(heads)}: export again")


POSITIVE: Check = (count, "a positive count")
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("gpt", runner="pygpt_runtime.run_onnx:OnnxGPT", main="pygpt_runtime.run_onnx:main",
           worker="rows",
           tasks={"generate": Task("pygpt_runtime.serve.completions:router")},
           fields={"models": _graph_files(()), "n_head": POSITIVE, "head_dim": POSITIVE,
                   "window_keep": POSITIVE, "inputs": (names, "the graph's input names"),
                   "v_head_dim": POSITIVE},
           defaults={"v_head_dim": "head_dim"},  # values as wide as keys unless it says
           check=_check_gpt, names_model=True),
    Family("bert", runner="pygpt_runtime.onnx_bert:OnnxBERT", main="pygpt_runtime.onnx_bert:main",
           worker="requests",
           tasks={"fill-mask": Task("pygpt_runtime.serve.tasks:fill_mask_router"),
                  "classify": Task("pygpt_runtime.serve.tasks:classify_router",
                                   {"labels": (names, "the list of the classifier's label "
                                                      "names")}),
                  "tag": Task("pygpt_runtime.serve.tasks:tag_router",
                              {"labels": (names, "the list of the tagger's BIO tags")}),
                  "qa": Task("pygpt_runtime.serve.tasks:answer_router",
                             {"labels": (lambda v: v == SPAN_LABELS,
                                         f"the answerer's outputs {SPAN_LABELS}")})},
           fields={"models": _graph_files(())}),
    Family("seq2seq", runner="pygpt_runtime.onnx_seq2seq:OnnxSeq2Seq",
           main="pygpt_runtime.onnx_seq2seq:main", worker="requests",
           tasks={"translate": Task("pygpt_runtime.serve.tasks:translate_router")},
           fields={"models": _graph_files(TRANSLATOR_PARTS),
                   "special_tokens": (_ids, "an object of token ids"),
                   "io": (_io, "each graph's input and output names")}),
)}
# The family whose pygpt-run entry answers a command line naming no readable export: it reports
# the error (and its --help lists the flags of the one-graph families, gpt and bert).
DEFAULT = "gpt"
