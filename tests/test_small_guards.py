"""Small guards on files that come from elsewhere: labelled data with an unmatched quote, export
file names outside their folder, labels unfit to print, an export over another family's, a
--resume with unchanged model flags, and the progress shown where stderr is a log file."""
import io
import json

import pytest

from pygpt.storage import checkpoint
from pygpt.config import ModelConfig, TrainConfig
from pygpt.config.fields import to_dict
from pygpt.data.labelled import read_labelled
from pygpt.onnx.graph import write_export
from pygpt.train import build_parser, configs_from_args
from pygpt.training.progress import Progress
from pygpt_runtime.runner_config import read_config as read_runner_config

GPT_RUNNER = {"family": "gpt", "tokenizer": {"kind": "char", "file": "tokenizer.json"},
              "block_size": 8, "models": {"fp32": "model.onnx"}, "n_head": 2, "head_dim": 8,
              "window_keep": 4, "inputs": ["idx"]}


@pytest.mark.parametrize("sep,name", [("\t", "d.tsv"), (",", "d.csv")])
def test_an_unmatched_quote_is_refused_at_its_line(tmp_path, sep, name):
    rows = [f"{'pos' if i % 2 else 'neg'}{sep}text {i}" for i in range(300)]
    rows[4] = f'pos{sep}"an opening quote that never closes'
    path = tmp_path / name
    path.write_text("\n".join([f"label{sep}text", *rows]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r'd\.(tsv|csv):6: a quoted field opens here .*"') as e:
        read_labelled(path)
    assert "\n" not in str(e.value)


def test_a_quote_closed_lines_later_is_refused(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text('label\ttext\npos\t"a\nneg\tb"\npos\tc\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"d\.tsv:2: a quoted field opens here"):
        read_labelled(path)


def test_balanced_quotes_still_read(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('label,text\npos,"good, ""very"" good"\nneg,bad\n', encoding="utf-8")
    assert [e.text for e in read_labelled(path)] == ['good, "very" good', "bad"]


def test_a_label_with_a_control_character_is_refused_in_data(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("label\ttext\npos\ta\n\x1b[2Jneg\tb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"d\.tsv:3: the label .* control character"):
        read_labelled(path)


@pytest.mark.parametrize("labels,pattern", [
    (["pos", "pos"], r"names 'pos' more than once"),
    (["pos", "\x1b]0;owned\x07"], r"control character"),
])
def test_labels_json_with_repeats_or_control_characters_is_refused(tmp_path, labels, pattern):
    (tmp_path / "config.json").write_text(json.dumps(
        {"format": 3, "step": 0, "model": {**to_dict(ModelConfig()), "num_labels": 2}}))
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    with pytest.raises(ValueError, match=pattern):
        checkpoint.load_labels(tmp_path)


@pytest.mark.parametrize("field,value", [
    ("models", {"fp32": "../model.onnx"}), ("models", {"fp32": "/etc/passwd"}),
    ("models", {"fp32": "sub/model.onnx"}), ("models", {"fp32": "model.onnx", "int8": ".."}),
    ("tokenizer", {"kind": "char", "file": "../tokenizer.json"}),
    ("tokenizer", {"kind": "char", "file": "/tmp/tokenizer.json"}),
])
def test_runner_json_names_only_files_of_its_folder(tmp_path, field, value):
    (tmp_path / "runner.json").write_text(json.dumps({**GPT_RUNNER, field: value}))
    with pytest.raises(ValueError, match=rf"runner\.json: {field} must be .*folder"):
        read_runner_config(tmp_path)


def test_a_seq2seq_runner_json_names_only_files_of_its_folder(tmp_path):
    parts = {"encoder": "e.onnx", "decoder": "d.onnx", "decoder_with_past": "../p.onnx"}
    (tmp_path / "runner.json").write_text(json.dumps(
        {"family": "seq2seq", "tokenizer": GPT_RUNNER["tokenizer"], "block_size": 8,
         "models": {"fp32": parts}, "special_tokens": {}, "io": {}}))
    with pytest.raises(ValueError, match=r"models must be .*folder"):
        read_runner_config(tmp_path)


class _Tokenizer:
    kind, special_tokens = "char", {}

    def to_json(self) -> str:
        return "{}"


def test_an_export_over_another_removes_the_earlier_graphs(tmp_path):
    for name, content in [("model.onnx", "gpt"), ("model.int8.onnx", "gpt8"),
                          ("notes.txt", "mine"), ("runner.json", json.dumps(
                              {**GPT_RUNNER, "models": {"fp32": "model.onnx",
                                                        "int8": "model.int8.onnx"}}))]:
        (tmp_path / name).write_text(content)
    graphs = {f"{part}.onnx": (lambda path: path.write_text("graph"))
              for part in ("encoder", "decoder")}
    write_export(tmp_path, graphs, lambda folder: None, None, _Tokenizer(),
                 {"family": "seq2seq", "task": "translate", "models": {"fp32": {}}})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "decoder.onnx", "encoder.onnx", "notes.txt", "runner.json", "tokenizer.json"]


def _saved_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"format": 3, "step": 5, "model": to_dict(ModelConfig(n_embd=16, n_head=2)),
         "train": to_dict(TrainConfig(out=str(tmp_path)))}))
    return ["--resume", "--out", str(tmp_path)]


def test_resume_accepts_model_flags_equal_to_the_saved_ones(tmp_path):
    args = build_parser().parse_args(_saved_run(tmp_path) + ["--n-embd", "16", "--n-head", "2"])
    model_cfg, _ = configs_from_args(args)
    assert (model_cfg.n_embd, model_cfg.n_head) == (16, 2)


def test_resume_refuses_changed_model_flags_naming_them(tmp_path):
    args = build_parser().parse_args(_saved_run(tmp_path) + ["--n-embd", "32", "--n-head", "2"])
    with pytest.raises(SystemExit, match=r"cannot change it: --n-embd 32 \(saved: 16\)$"):
        configs_from_args(args)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_plain_lines_and_a_bar_on_a_terminal():
    log = io.StringIO()
    progress = Progress(1000, 0, True, stream=log, interval=0.0)
    for _ in range(3):
        progress.update(1.5, 1000.0)
    progress.close()
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [f"step {i}/1000: loss 1.5000, 1,000 tokens/s"
                                           for i in (1, 2, 3)]
    terminal = _Terminal()
    progress = Progress(1000, 0, True, stream=terminal)
    progress.update(1.5, 1000.0)
    progress.close()
    assert "\r" in terminal.getvalue() and "1000" in terminal.getvalue()
    quiet = io.StringIO()
    Progress(10, 0, False, stream=quiet).update(1.0, 1.0)
    assert quiet.getvalue() == ""
