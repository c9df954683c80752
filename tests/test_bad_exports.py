"""The runner (pygpt-run) on export folders that are damaged or hand-edited, or whose model is
broken, where a user meets it: every field of runner.json it reads, a tokenizer of the wrong
shape, a graph of another model, a translator's missing, truncated or garbage graph, text that
is not UTF-8, --threads 0 and weights of NaN are each one `error:` line with exit status 1, never
a traceback or confident garbage."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from helpers import RUNNER_COMMAND
from pygpt.storage import checkpoint
from pygpt.export import export
from pygpt.storage.run_files import RUNNER_CONFIG
from test_bad_folders import bert_folder, translator_folder
from test_runner_cli import exported  # noqa: F401  (the tiny GPT export)


@pytest.fixture(scope="module")
def exports(exported, tmp_path_factory):  # noqa: F811
    """The export folders by family: gpt, bert (fill-mask), classifier, seq2seq."""
    root = tmp_path_factory.mktemp("bad-exports")
    export(bert_folder(root / "bert"), root / "bert-onnx")
    export(bert_folder(root / "cls", num_labels=2), root / "cls-onnx")
    export(translator_folder(root / "mt"), root / "mt-onnx")
    return {"gpt": exported[1], "bert": root / "bert-onnx", "cls": root / "cls-onnx",
            "mt": root / "mt-onnx"}


ARGS = {"gpt": ["--prompt", "First", "--max-new-tokens", "3"], "bert": ["--text", "to [MASK]"],
        "cls": ["--text", "to be"], "mt": ["--text", "abc"]}


def copy(exports, which, tmp_path):
    return Path(shutil.copytree(exports[which], tmp_path / which))


def one_error_line(folder, args):
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(folder), *args], capture_output=True,
                          timeout=120)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 1 and "Traceback" not in err, err
    assert done.stdout == b"" or done.stdout == b"First", done.stdout  # the prompt, for a gpt
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def edit_runner_json(folder, **fields):
    config = json.loads((folder / RUNNER_CONFIG).read_text())
    for key, value in fields.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (folder / RUNNER_CONFIG).write_text(json.dumps(config))


@pytest.mark.parametrize("which, fields, words", [
    ("gpt", dict(tokenizer="tokenizer.json"), "tokenizer must be"),
    ("gpt", dict(block_size=-3), "block_size must be"),
    ("gpt", dict(block_size=2 ** 40), "block_size must be a positive count of at most"),
    ("gpt", dict(block_size=4096), "positions but its runner.json's block_size is 4096"),
    ("bert", dict(block_size=4096), "positions but its runner.json's block_size is 4096"),
    ("mt", dict(block_size=4096), "positions but its runner.json's block_size is 4096"),
    ("gpt", dict(window_keep=99), "window_keep"),
    ("gpt", dict(inputs="input_ids"), "inputs must be"),
    ("gpt", dict(family="llama"), "family must be"),
    ("bert", dict(family="gpt"), "lacks"),
    ("cls", dict(labels=None), "lacks labels"),
    ("cls", dict(labels="ab"), "labels must be"),
    ("cls", dict(labels=["only"]), "names 1 labels but the model gives 2"),
    ("mt", dict(io=None), "lacks io"),
    ("mt", dict(special_tokens=None), "lacks special_tokens"),
    ("mt", dict(models={"fp32": "encoder_model.onnx"}), "models must be"),
], ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}={v}" for k, v in x.items()))
def test_a_damaged_runner_json_field_is_one_line(exports, tmp_path, which, fields, words):
    folder = copy(exports, which, tmp_path)
    edit_runner_json(folder, **fields)
    assert words in one_error_line(folder, ARGS[which])


def test_chars_that_are_not_a_list_is_one_line(exports, tmp_path):
    folder = copy(exports, "gpt", tmp_path)
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**spec, "chars": "".join(spec["chars"])}))
    assert "tokenizer.json is damaged" in one_error_line(folder, ARGS["gpt"])


def test_a_tokenizer_of_another_size_is_one_line(exports, tmp_path):
    folder = copy(exports, "gpt", tmp_path)
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**spec, "chars": spec["chars"][:-1]}))
    assert "tokens but the model" in one_error_line(folder, ARGS["gpt"])


def test_a_bert_graph_in_a_gpt_export_is_one_line(exports, tmp_path):
    folder = copy(exports, "gpt", tmp_path)
    shutil.copy(exports["bert"] / "model.onnx", folder / "model.onnx")
    assert "a graph of another model" in one_error_line(folder, ARGS["gpt"])


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage"])
def test_a_damaged_translator_graph_is_one_line(exports, tmp_path, damage):
    folder = copy(exports, "mt", tmp_path)
    graph = folder / "decoder_model.onnx"
    if damage == "missing":
        graph.unlink()
    elif damage == "truncated":
        graph.write_bytes(graph.read_bytes()[:graph.stat().st_size // 2])
    else:
        graph.write_bytes(os.urandom(4096))
    assert str(graph) in one_error_line(folder, ARGS["mt"])


def test_translator_text_that_is_not_utf8_and_threads_zero_are_one_line(exports):
    line = one_error_line(exports["mt"], ["--text", b"ab\xff"])
    assert line == "error: --text is not valid UTF-8 (byte 0xff at character 2)"
    for which in exports:
        assert "--threads" in one_error_line(exports[which], [*ARGS[which], "--threads", "0"])


@pytest.mark.parametrize("which", ["gpt", "bert", "cls", "mt"])
def test_nan_weights_are_one_line(exports, tmp_path, which):
    folder = copy(exports, which, tmp_path)
    graph_file = folder / ("encoder_model.onnx" if which == "mt" else "model.onnx")
    graph = onnx.load(str(graph_file))
    init = max(graph.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    values = numpy_helper.to_array(init).copy()
    values[...] = np.nan
    init.CopyFrom(numpy_helper.from_array(values, init.name))
    onnx.save(graph, str(graph_file))
    for args in ([*ARGS[which]], [*ARGS[which], "--greedy"] if which == "gpt" else []):
        if args:
            assert "not finite numbers" in one_error_line(folder, args)
