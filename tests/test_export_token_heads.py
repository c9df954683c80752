"""The ONNX export of the BERT heads that read each token, an entity tagger (--task tag) and a
question answerer (--task qa), and the torch-free runner's tagging and answering: each tiny
trained model, exported once (fp32 and int8), must give PyTorch's per-token logits in
onnxruntime on padded batches (int8 close), and pygpt-run must print what python -m pygpt.tag
--text / --data and python -m pygpt.answer --question --context / --data print, texts longer
than the context (read in overlapping rows) included, in a process where torch cannot be
imported. An export whose labels do not fit its graph and a flag of another task are refused in
one line (tests/test_serve_token_heads.py serves them)."""
import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

from helpers import RUNNER_COMMAND, torch_free_env
import pygpt
import pygpt.answer
import pygpt.tag
from pygpt import export as exporter
from pygpt.onnx.bert import padded_batch
from pygpt.storage.run_files import RUNNER_CONFIG
from pygpt_runtime import command as runner_command
from test_answer import FIXTURE as QA_FIXTURE, answerer  # noqa: F401  (the tiny answerer)
from test_tag import FIXTURE as TAG_FIXTURE, run, tagger  # noqa: F401  (the tiny tagger)

LENGTHS = [[32], [7, 1, 19], [3, 30, 12, 1, 5]]  # all padded but the first
TEXTS = ["Yuki Tanaka works for Acme Corp in New York, said Reuters.",
         # past the tagger's 32 positions: overlapping rows, each word read where best
         "Peter Blackburn of Acme Corp met Yuki Tanaka in Paris on Monday, and then Maria "
         "Garcia flew from New York to Berlin with Reuters staff; they spoke at length there."]
CONTEXT = ("The Danube is the second-longest river in Europe. It flows through Vienna, "
           "Budapest and Belgrade before it reaches the Black Sea.")
QUESTIONS = [["--question", "Which sea does the Danube reach?", "--context", CONTEXT],
             ["--question", "Where does the Rhine rise?", "--context",
              "The Rhine rises in the Swiss Alps and flows north to the North Sea."],
             ["--question", "Which city?", "--context", CONTEXT, "--no-answer"],
             ["--question", "Which city?", "--context", CONTEXT, "--no-answer",
              "--null-threshold", "1000"]]


@pytest.fixture(scope="module")
def exports(tagger, answerer, tmp_path_factory):  # noqa: F811
    """{"tag": (checkpoint, export), "qa": (checkpoint, export)}, int8 graphs included."""
    root = tmp_path_factory.mktemp("token-heads")
    for name, ckpt in (("tag", tagger), ("qa", answerer)):
        exporter.export(ckpt, root / name, quantize="int8")
    return {"tag": (tagger, root / "tag"), "qa": (answerer, root / "qa")}


def session(onnx_dir, name="model.onnx"):
    import onnxruntime as ort

    return ort.InferenceSession(str(onnx_dir / name), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("task", ["tag", "qa"])
def test_runner_config_names_the_task_and_labels(exports, task):
    ckpt, onnx_dir = exports[task]
    config = json.loads((onnx_dir / RUNNER_CONFIG).read_text())
    assert config["family"] == "bert" and config["task"] == task
    assert config["labels"] == pygpt.storage.checkpoint.load_labels(ckpt)
    assert (config["labels"] == ["start", "end"]) == (task == "qa")
    assert sorted(p.name for p in onnx_dir.iterdir()) == [
        "model.int8.onnx", "model.onnx", "runner.json", "tokenizer.json"]


@pytest.mark.parametrize("task", ["tag", "qa"])
def test_logits_per_token_match_pytorch_and_int8_stays_close(exports, task):
    ckpt, onnx_dir = exports[task]
    model, _ = pygpt.load(ckpt)
    fp32, int8 = session(onnx_dir), session(onnx_dir, "model.int8.onnx")
    for seed, lengths in enumerate(LENGTHS):
        batch = padded_batch(model.config.vocab_size, lengths, seed=seed + 20)
        with torch.no_grad():
            expected = model(batch["input_ids"], segment_ids=batch["token_type_ids"],
                             lengths=torch.tensor(lengths)).logits.numpy()
        feeds = {k: v.numpy() for k, v in batch.items()}
        got, got8 = (s.run(None, feeds)[0] for s in (fp32, int8))
        assert got.shape == (len(lengths), max(lengths), model.config.num_labels)
        real = batch["attention_mask"].numpy().astype(bool)
        np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=0)
        assert np.abs(got8[real] - expected[real]).max() < 0.5


def test_tagging_prints_what_pygpt_tag_prints(exports):
    ckpt, onnx_dir = exports["tag"]
    for text in TEXTS:
        expected = run(pygpt.tag.main, ["--ckpt", str(ckpt), "--text", text])
        assert run(runner_command.main, ["--model", str(onnx_dir), "--text", text]) == expected
    model, tokenizer, labels = pygpt.tag.load_tagger(str(ckpt))
    assert pygpt.tag.tag_text(model, tokenizer, labels, TEXTS[1]), "the tagger finds nothing"
    assert len(tokenizer.encode(TEXTS[1])) > 32  # the long text takes several rows


def test_scoring_a_file_prints_what_pygpt_tag_prints(exports, tmp_path):
    """The fixture (its long sentence read in several rows) and an IOB1 file, whose I- tags
    that begin entities are counted and read as B-."""
    ckpt, onnx_dir = exports["tag"]
    iob1 = tmp_path / "iob1.conll"
    iob1.write_text("Yuki\tI-PER\nTanaka\tI-PER\nflew\tO\nto\tO\nParis\tI-LOC\n")
    for data in (TAG_FIXTURE, iob1):
        expected = run(pygpt.tag.main, ["--ckpt", str(ckpt), "--data", str(data)])
        got = run(runner_command.main, ["--model", str(onnx_dir), "--data", str(data)])
        assert got == expected
    assert expected.startswith("2 I- tags that began an entity were read as B-")
    with pytest.raises(SystemExit, match="^error: .*line 1: tags B-DATE are not the model's"):
        (tmp_path / "date.conll").write_text("May\tB-DATE\n")
        runner_command.main(["--model", str(onnx_dir), "--data", str(tmp_path / "date.conll")])


def test_answering_prints_what_pygpt_answer_prints(exports):
    ckpt, onnx_dir = exports["qa"]
    outputs = set()
    for args in QUESTIONS:
        expected = run(pygpt.answer.main, ["--ckpt", str(ckpt), *args])
        assert run(runner_command.main, ["--model", str(onnx_dir), *args]) == expected
        outputs.add(expected.split(" ")[0])
    assert outputs == {"answer", "no"}  # answers given and withheld
    _, tokenizer = pygpt.load(ckpt)
    assert len(tokenizer.encode(CONTEXT)) > 32  # a context of several windows


def test_scoring_a_squad_file_prints_what_pygpt_answer_prints(exports, tmp_path):
    """The fixture, v2.0 with unanswerable questions (scored by kind), and a bad file."""
    ckpt, onnx_dir = exports["qa"]
    expected = run(pygpt.answer.main, ["--ckpt", str(ckpt), "--data", str(QA_FIXTURE)])
    got = run(runner_command.main, ["--model", str(onnx_dir), "--data", str(QA_FIXTURE)])
    assert got == expected
    assert "unanswerable: exact match" in expected
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "q1"}]}]}]}')
    with pytest.raises(SystemExit, match="^error: .*question 'q1': no 'question'$"):
        runner_command.main(["--model", str(onnx_dir), "--data", str(bad)])


def test_the_runner_needs_no_torch(exports, tmp_path):
    env = torch_free_env(tmp_path)
    for task, args in (("tag", ["--text", TEXTS[1], "--int8"]), ("qa", QUESTIONS[0])):
        done = subprocess.run([*RUNNER_COMMAND, "--model", str(exports[task][1]), *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip()


@pytest.mark.parametrize("task, args, pattern", [
    ("tag", ["--question", "a", "--context", "b"], "takes either --data .* or --text"),
    ("tag", ["--text", "a", "--data", "x"], "takes either --data"),
    ("qa", ["--data", "x", "--question", "a"], "takes either --data .* or --question"),
    ("qa", ["--data", "x", "--context", "a"], "--context goes with --question"),
    ("tag", ["--text", "a", "--question", "b"], "--question and --context are for"),
    ("tag", ["--text", "a", "--text-pair", "b"], "--text-pair is for a classifier"),
    ("tag", ["--text", "a", "--no-answer"], "--no-answer and --null-threshold are for"),
    ("tag", ["--text", " ,"], None),
    ("tag", ["--text", "   "], "--text holds no words"),
    ("qa", ["--text", "a"], "takes either --data .* or --question and --context"),
    ("qa", ["--question", "a"], "--question needs --context"),
    ("qa", ["--question", "a", "--context", " \n"], "--context is empty"),
    ("qa", ["--question", "where " * 40, "--context", "x"],
     "--question: the question's 160 pieces leave no room")])
def test_refusals_are_one_line(exports, task, args, pattern, capsys):
    ckpt, onnx_dir = exports[task]
    if pattern is None:  # a text of punctuation alone has words: both tag it
        assert (run(runner_command.main, ["--model", str(onnx_dir), *args])
                == run(pygpt.tag.main, ["--ckpt", str(ckpt), *args]))
        return
    with pytest.raises(SystemExit, match="^error: .*" + pattern):
        runner_command.main(["--model", str(onnx_dir), *args])
    assert capsys.readouterr().out == ""


def edited(exports, task, tmp_path, **fields):
    folder = shutil.copytree(exports[task][1], tmp_path / task)
    config = json.loads((folder / RUNNER_CONFIG).read_text())
    (folder / RUNNER_CONFIG).write_text(json.dumps({**config, **fields}))
    return folder


def test_labels_that_do_not_fit_the_graph_are_refused(exports, tmp_path):
    labels = json.loads((exports["tag"][1] / RUNNER_CONFIG).read_text())["labels"]
    folder = edited(exports, "tag", tmp_path, labels=labels[:-1])
    with pytest.raises(SystemExit, match=f"^error: .*names {len(labels) - 1} labels but the "
                                         f"model gives {len(labels)} classes: export again$"):
        runner_command.main(["--model", str(folder), "--text", TEXTS[0]])
    folder = edited(exports, "qa", tmp_path, labels=["end", "start"])
    with pytest.raises(SystemExit, match="^error: .*labels must be the answerer's outputs"):
        runner_command.main(["--model", str(folder), *QUESTIONS[0]])

