"""python -m pygpt.convert on damaged or foreign folders: one error line each, nothing written
(a pickle-only folder is refused with how to convert it, never unpickled), and the output
folders' rules (a run over an earlier run only with --overwrite; an HF export into a new or
empty folder only)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_helpers import convert, gpt2_folder
from helpers import snapshot

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    gpt2_folder(root / "hf", n_layer=1)
    return root / "hf"


@pytest.fixture
def copy(folder, tmp_path):
    """A fresh copy of the tiny GPT-2 folder to damage."""
    out = tmp_path / "hf"
    out.mkdir()
    for path in folder.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    return out


def refused(source, out, *words):
    code, message = convert("--from-hf", source, "--out", out)
    assert code == 1 and message.startswith("error: ") and "\n" not in message, message
    for word in words:
        assert word in message, message
    assert not out.exists()


def test_pickle_only_is_refused_with_how_to_convert(copy, tmp_path, monkeypatch):
    (copy / "model.safetensors").unlink()
    (copy / "pytorch_model.bin").write_bytes(b"not even read")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    refused(copy, tmp_path / "run", "pytorch_model.bin", "never loads pickled",
            "save_pretrained")


def edit_json(path, **fields):
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("damage, words", [
    (lambda f: (f / "model.safetensors").unlink(), ["no model.safetensors"]),
    (lambda f: (f / "config.json").unlink(), ["no config.json"]),
    (lambda f: [(f / n).unlink() for n in ("vocab.json", "merges.txt")], ["no tokenizer"]),
    (lambda f: (f / "config.json").write_text("{oops"), ["not valid JSON"]),
    (lambda f: (f / "config.json").write_text("[1]"), ["JSON object"]),
    (lambda f: (f / "model.safetensors").write_bytes(b"\x10\x00" * 20), ["not a safetensors"]),
    (lambda f: (f / "vocab.json").write_text('{"a": "b"}'), ["vocab.json"]),
    (lambda f: (f / "merges.txt").write_text("#version: 0.2\na b c\n"), ["merges.txt line 2"]),
    (lambda f: ((f / "model.safetensors.index.json").write_text("{}"),
                (f / "model.safetensors").unlink()), ["sharded"]),
    (lambda f: edit_json(f / "config.json", model_type=["gpt2"]), ["model_type ['gpt2']"]),
    (lambda f: edit_json(f / "vocab.json", a=-1), ["vocab.json: the id of 'a' is -1"]),
    (lambda f: edit_json(f / "vocab.json", a=2 ** 40), ["vocab.json: the id of 'a' is 1099"]),
    (lambda f: (f / "tokenizer_config.json").write_text('{"add_prefix_space": "yes"}'),
     ["tokenizer_config.json: add_prefix_space must be bool"]),
    (lambda f: edit_json(f / "vocab.json", a=2 ** 31), ["vocab.json maps a token to the id 2147"]),
])
def test_damaged_folders_are_one_line_errors(copy, tmp_path, damage, words):
    damage(copy)
    refused(copy, tmp_path / "run", *words)


def edit_weights(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.update({"transformer.wpe.weight": torch.zeros(31, 32)}),
     ["transformer.wpe.weight", "(31, 32)", "(32, 32)"]),
    (lambda t: t.pop("transformer.h.0.mlp.c_fc.bias"), ["lacks transformer.h.0.mlp.c_fc.bias"]),
    (lambda t: t.update({"transformer.h.1.ln_1.weight": torch.ones(32)}),
     ["holds transformer.h.1.ln_1.weight"]),
    (lambda t: t.update({"transformer.ln_f.weight": torch.full((32,), float("nan"))}),
     ["NaN"]),
    (lambda t: t.update({"transformer.ln_f.weight": torch.ones(32, dtype=torch.int32)}),
     ["not floating point"]),
])
def test_tensors_that_do_not_fit_the_config(copy, tmp_path, edit, words):
    edit_weights(copy, edit)
    refused(copy, tmp_path / "run", *words)


def test_a_vocabulary_of_another_size_is_refused(copy, tmp_path):
    config = json.loads((copy / "config.json").read_text())
    vocab = json.loads((copy / "vocab.json").read_text())
    vocab["extra"] = len(vocab)
    (copy / "vocab.json").write_text(json.dumps(vocab))
    refused(copy, tmp_path / "run", f"{config['vocab_size'] + 1} tokens",
            f"vocab_size is {config['vocab_size']}")


def test_symbolic_links_are_not_followed(copy, tmp_path):
    elsewhere = tmp_path / "elsewhere.safetensors"
    (copy / "model.safetensors").rename(elsewhere)
    (copy / "model.safetensors").symlink_to(elsewhere)
    refused(copy, tmp_path / "run", "symbolic link")


def test_linked_folders_are_refused_both_ways(folder, copy, tmp_path):
    """A symbolic link named as the folder to read or to write is refused, never followed."""
    (tmp_path / "link").symlink_to(copy)
    refused(tmp_path / "link", tmp_path / "run", "--from-hf", "symbolic link")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out-link").symlink_to(tmp_path / "elsewhere")
    code, message = convert("--from-hf", folder, "--out", tmp_path / "out-link")
    assert code == 1 and "--out" in message and "symbolic link" in message, message
    assert convert("--from-hf", folder, "--out", tmp_path / "run") == (0, None)
    code, message = convert("--to-hf", tmp_path / "run", "--out", tmp_path / "out-link")
    assert code == 1 and "--out" in message and "symbolic link" in message, message
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_missing_folder(tmp_path):
    refused(tmp_path / "nowhere", tmp_path / "run", "no Hugging Face model folder")


def test_run_folder_rules(folder, tmp_path):
    run = tmp_path / "run"
    assert convert("--from-hf", folder, "--out", run) == (0, None)
    before = snapshot(run)
    code, message = convert("--from-hf", folder, "--out", run)
    assert code == 1 and "already holds a checkpoint" in message
    assert convert("--from-hf", folder, "--out", run, "--overwrite") == (0, None)
    assert snapshot(run).keys() == before.keys()
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    code, message = convert("--from-hf", folder, "--out", stranger, "--overwrite")
    assert code == 1 and "never replaces" in message
    assert snapshot(stranger) == {"notes.txt": b"mine"}


def test_export_folder_rules(folder, tmp_path):
    run = tmp_path / "run"
    assert convert("--from-hf", folder, "--out", run) == (0, None)
    code, message = convert("--to-hf", run, "--out", run)
    assert code == 1 and "run folder itself" in message
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    code, message = convert("--to-hf", run, "--out", taken)
    assert code == 1 and "not empty" in message and "\n" not in message
    assert snapshot(taken) == {"notes.txt": b"mine"}
    code, message = convert("--to-hf", tmp_path / "nothing", "--out", tmp_path / "hf")
    assert code == 1 and "\n" not in message and not (tmp_path / "hf").exists()
    code, message = convert("--to-hf", run, "--out", tmp_path / "hf", "--overwrite")
    assert code == 1 and "--from-hf only" in message


def test_failed_export_leaves_no_folder(folder, tmp_path, monkeypatch):
    import pygpt.hf

    run = tmp_path / "run"
    assert convert("--from-hf", folder, "--out", run) == (0, None)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pygpt.hf, "save_file", full_disk)
    code, message = convert("--to-hf", run, "--out", tmp_path / "hf")
    assert code == 1 and "No space left" in message and "\n" not in message
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").iterdir())
