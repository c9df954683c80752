"""The runtime's table of families (pygpt_runtime/families.py) is the one place that knows them:
every part it names exists, its families are pygpt's, runner.json is checked by it (each
family's fields, its task, a default task for a family of one), and pygpt-run hands a command
line to the entry it names, so that a new family is its runner module and one table entry."""
import json
from pathlib import Path

import pytest

from pygpt.config import ARCHS
from pygpt.serve.checkpoint import OPENERS
from pygpt_runtime import command
from pygpt_runtime.families import FAMILIES, Family, Task, count, load
from pygpt_runtime.runner_config import read_config


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_part_the_table_names_exists(name):
    family = FAMILIES[name]
    assert family.name == name and family.worker in ("rows", "requests")
    assert isinstance(load(family.runner), type) and callable(load(family.main))
    assert family.tasks and all(task.routes is None or callable(load(task.routes))
                                for task in family.tasks.values())


def test_the_runtime_runs_pygpts_families():
    """The runtime's families are pygpt's, and each can be served from a checkpoint too (the
    opener pygpt.serve.checkpoint registers for it)."""
    assert set(FAMILIES) == set(ARCHS) == set(OPENERS)


def write_runner_json(folder: Path, **fields) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "runner.json").write_text(json.dumps(
        {"tokenizer": {"kind": "char", "file": "tokenizer.json"}, "block_size": 8, **fields}))
    return folder


GPT = dict(family="gpt", models={"fp32": "model.onnx"}, n_head=2, head_dim=4, window_keep=4,
           inputs=["input_ids", "past_key_values.0.key", "past_key_values.0.value"])


def test_runner_json_is_checked_by_the_table(tmp_path):
    assert read_config(write_runner_json(tmp_path / "old", **GPT))["task"] == "generate"
    with pytest.raises(ValueError, match=r'task must be "generate", got .classify.'):
        read_config(write_runner_json(tmp_path / "wrong", **GPT, task="classify"))
    bert = dict(family="bert", models={"fp32": "model.onnx"})
    with pytest.raises(ValueError, match="lacks task"):  # a family of two tasks must say which
        read_config(write_runner_json(tmp_path / "bert", **bert))
    with pytest.raises(ValueError, match="lacks labels"):  # the classify task's field
        read_config(write_runner_json(tmp_path / "cls", **bert, task="classify"))


def toy_main(argv):
    """The pygpt-run entry of the toy family below."""
    raise SystemExit(f"toy ran {argv[-1]}")


def test_a_new_family_is_one_entry(tmp_path, monkeypatch):
    toy = Family("toy", runner="builtins:object", main="test_runtime_families:toy_main",
                 worker="requests", tasks={"count": Task("builtins:print")},
                 fields={"beads": (count, "a positive count")})
    monkeypatch.setitem(FAMILIES, "toy", toy)
    folder = write_runner_json(tmp_path / "toy", family="toy", beads=3)
    assert read_config(folder) == {"family": "toy", "task": "count", "beads": 3,
                                   **json.loads((folder / "runner.json").read_text())}
    with pytest.raises(SystemExit, match="toy ran 7"):
        command.main(["--model", str(folder), "--beads", "7"])
    with pytest.raises(ValueError, match="beads must be a positive count"):
        read_config(write_runner_json(tmp_path / "bad", family="toy", beads=0))
