"""`python -m pygpt.prune` on tiny runs of every family: the pruned run is a normal, smaller
run folder that loads, generates (fills masks, classifies, translates), exports and runs in the
torch-free runner, also where the global ranking leaves its layers different head counts and
MLP widths; pruning nothing gives the original weights bit for bit; the same command gives the
same bytes twice; --recover-iters trains on; Hugging Face refuses what it cannot hold; bad
flags and a runner.json whose per-layer heads are wrong are one-line errors."""
import contextlib
import dataclasses
import io
import json
import re
import subprocess

import pytest
import torch
from safetensors.torch import load_file

import pygpt.classify
import pygpt.convert
import pygpt.export
import pygpt.fill_mask
import pygpt.generate
import pygpt.prune
import pygpt.train
import pygpt.translate
from helpers import RUNNER_COMMAND, TINY, metrics, state_dicts_equal, torch_free_env
from pygpt.storage import checkpoint
from pygpt.families import build
from pygpt.storage.run_files import CONFIG, WEIGHTS
from pygpt.tokenizer import CharTokenizer
from test_classify import files  # noqa: F401  (the zebra task's labelled files, a fixture)
from test_seq2seq_train import _pairs, data  # noqa: F401  (a fixture: sentence pairs)


def run(main, args):
    """main(args)'s standard output."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(args)
    return buf.getvalue()


def prune(args):
    return run(pygpt.prune.main, [*map(str, args), "--batches", "2", "--quiet", "--threads", "1"])


@pytest.fixture(scope="module")
def gpt(text_file, tmp_path_factory):
    """A tiny GPT with 4 heads (the shared `trained` run has 2)."""
    out = tmp_path_factory.mktemp("gpt") / "run"
    run(pygpt.train.main, ["--data", str(text_file), "--out", str(out), "--n-layer", "2",
                           "--n-embd", "32", "--n-head", "4", "--block-size", "16",
                           "--max-iters", "4", "--eval-interval", "4", "--eval-iters", "2",
                           "--batch-size", "4", "--warmup-iters", "1", "--quiet"])
    return out


def test_a_pruned_gpt_loads_generates_exports_and_runs_without_torch(gpt, tmp_path):
    """--head-fraction 0.625 of the 8 heads leaves 3, so the two layers keep different counts
    (as --mlp-fraction 0.3 leaves 179 of 256 units); the export's runner.json says each layer's
    heads and the runner's greedy text is pygpt's."""
    out = tmp_path / "pruned"
    line = prune(["--ckpt", gpt, "--out", out, "--head-fraction", "0.625", "--mlp-fraction", "0.3"])
    model, _ = checkpoint.load(out)
    cfg = model.config
    assert sorted(cfg.layer_heads) == [1, 2] and cfg.n_head == 2
    assert sum(cfg.layer_mlp_dims) == 179 and len(set(cfg.layer_mlp_dims)) == 2
    assert (cfg.qk_dim, cfg.v_dim) == (8, 8)
    heads, units = ", ".join(map(str, cfg.layer_heads)), ", ".join(map(str, cfg.layer_mlp_dims))
    assert f"kept 3 of 8 heads (per layer {heads}) and 179 of 256 MLP units (per layer {units})" \
        in line
    saved = json.loads((out / CONFIG).read_text())
    assert saved["train"]["out"] == str(out)
    assert saved["model"]["layer_heads"] == list(cfg.layer_heads)
    text = run(pygpt.generate.main, ["--ckpt", str(out), "--prompt", "RO", "--greedy",
                                     "--max-new-tokens", "12"])
    assert text.startswith("RO")
    run(pygpt.export.main, ["--ckpt", str(out), "--out", str(tmp_path / "onnx")])
    runner = json.loads((tmp_path / "onnx" / "runner.json").read_text())
    assert runner["layer_heads"] == list(cfg.layer_heads) and runner["n_head"] == 2
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(tmp_path / "onnx"), "--prompt", "RO",
                           "--max-new-tokens", "12", "--greedy"], capture_output=True, text=True,
                          env=torch_free_env(tmp_path), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == text.rstrip("\n")  # the runner decodes as pygpt does
    with pytest.raises(SystemExit) as e:
        pygpt.convert.main(["--to-hf", str(out), "--out", str(tmp_path / "hf")])
    assert "layer_heads is set (Hugging Face's layers all have one head count)" in str(e.value)
    assert "layer_mlp_dims is set" in str(e.value) and "\n" not in str(e.value)


def test_a_uniform_pruning_reports_per_layer_and_writes_no_per_layer_fields(gpt, tmp_path):
    out = tmp_path / "pruned"
    line = prune(["--ckpt", gpt, "--out", out, "--heads-per-layer", "2"])
    assert "2 of 4 heads and 128 of 128 MLP units per layer kept" in line
    assert not {"layer_heads", "layer_mlp_dims"} & set(json.loads((out / CONFIG).read_text())[
        "model"])
    run(pygpt.export.main, ["--ckpt", str(out), "--out", str(tmp_path / "onnx")])
    assert "layer_heads" not in json.loads((tmp_path / "onnx" / "runner.json").read_text())


@pytest.mark.parametrize("heads, message", [
    ([2], "layer_heads must hold a head count of 1 to n_head \\(2\\) for each of its 2 layers"),
    ([2, 3], "layer_heads must hold a head count of 1 to n_head"),
    ("2,1", "layer_heads must hold a head count"),
])
def test_a_runner_json_with_wrong_per_layer_heads_is_one_line(gpt, tmp_path, heads, message):
    out = tmp_path / "pruned"
    prune(["--ckpt", gpt, "--out", out, "--head-fraction", "0.625"])
    run(pygpt.export.main, ["--ckpt", str(out), "--out", str(tmp_path / "onnx")])
    path = tmp_path / "onnx" / "runner.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "layer_heads": heads}))
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(tmp_path / "onnx"), "--prompt", "RO",
                           "--max-new-tokens", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and re.search(message, done.stderr), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_globally_pruned_bert_fills_masks_as_its_export(text_file, tmp_path):
    src = tmp_path / "bert"
    run(pygpt.train.main, ["--arch", "bert", "--data", str(text_file), "--out", str(src),
                           "--vocab-size", "200", "--n-layer", "2", "--n-embd", "32",
                           "--n-head", "4", "--block-size", "32", "--max-iters", "2",
                           "--eval-interval", "2", "--eval-iters", "1", "--batch-size", "4",
                           "--quiet"])
    out = tmp_path / "pruned"
    prune(["--ckpt", src, "--out", out, "--head-fraction", "0.625", "--mlp-fraction", "0.3"])
    cfg = checkpoint.load(out)[0].config
    assert sorted(cfg.layer_heads) == [1, 2] and sum(cfg.layer_mlp_dims) == 179
    args = ["--text", "To be, or not to [MASK]", "--top-k", "3"]
    expected = run(pygpt.fill_mask.main, ["--ckpt", str(out), *args])
    assert expected.strip()
    run(pygpt.export.main, ["--ckpt", str(out), "--out", str(tmp_path / "onnx")])
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(tmp_path / "onnx"), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def test_the_same_pruning_gives_the_same_model(gpt, tmp_path):
    """Scores are measured on the same batches (a fixed seed), so the same heads and units go."""
    for name in ("a", "b"):
        prune(["--ckpt", gpt, "--out", tmp_path / name, "--heads-per-layer", "3",
               "--mlp-fraction", "0.5"])
    state_dicts_equal(load_file(tmp_path / "a" / WEIGHTS), load_file(tmp_path / "b" / WEIGHTS))


def test_heads_per_layer_keeps_the_model_uniform(gpt, tmp_path):
    """--heads-per-layer with --mlp-fraction ranks each layer alone: every layer the same."""
    prune(["--ckpt", gpt, "--out", tmp_path / "u", "--heads-per-layer", "3",
           "--mlp-fraction", "0.5"])
    model = json.loads((tmp_path / "u" / CONFIG).read_text())["model"]
    source = json.loads((gpt / CONFIG).read_text())["model"]
    assert model["n_head"] == 3 and model["mlp_dim"] == 2 * source["n_embd"]
    assert "layer_heads" not in model and "layer_mlp_dims" not in model


def test_pruning_nothing_keeps_the_model_bit_for_bit(gpt, tmp_path):
    prune(["--ckpt", gpt, "--out", tmp_path / "same", "--heads-per-layer", "4"])
    assert (json.loads((tmp_path / "same" / CONFIG).read_text())["model"]
            == json.loads((gpt / CONFIG).read_text())["model"])
    state_dicts_equal(load_file(tmp_path / "same" / WEIGHTS), load_file(gpt / WEIGHTS))


def test_recover_iters_fine_tunes_a_run_that_resumes(gpt, tmp_path):
    out = tmp_path / "recovered"
    line = prune(["--ckpt", gpt, "--out", out, "--heads-per-layer", "2", "--recover-iters", "2"])
    assert "recovered 2 steps" in line
    assert [r["step"] for r in metrics(out)] == [2]
    assert checkpoint.load_train_state(out)["step"] == 2
    model, _ = checkpoint.load(out)
    assert model.config.n_head == 2


def test_a_second_prune_into_a_run_names_what_continues_it(gpt, tmp_path):
    """A prune cut short (a kill during its recovery) left a run in --out: pruning into it again
    names the options that exist (prune has no --resume; train --resume continues the run)."""
    out = tmp_path / "recovered"
    prune(["--ckpt", gpt, "--out", out, "--heads-per-layer", "2", "--recover-iters", "2"])
    with pytest.raises(SystemExit) as e:
        prune(["--ckpt", gpt, "--out", out, "--heads-per-layer", "2", "--recover-iters", "3"])
    message = str(e.value.code)
    assert "pass --resume" not in message and "--overwrite" in message, message
    assert f"python -m pygpt.train --resume --out {out} continues" in message, message
    run(pygpt.train.main, ["--resume", "--out", str(out), "--max-iters", "3", "--quiet"])
    assert checkpoint.load_train_state(out)["step"] == 3


def test_hugging_face_refuses_pruned_heads_by_name(gpt, tmp_path):
    prune(["--ckpt", gpt, "--out", tmp_path / "p", "--heads-per-layer", "3"])
    with pytest.raises(SystemExit) as e:
        pygpt.convert.main(["--to-hf", str(tmp_path / "p"), "--out", str(tmp_path / "hf")])
    assert "qk_dim is 8" in str(e.value) and "v_dim is 8" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_gpt_whose_values_are_narrower_than_its_keys_exports_and_runs(tmp_path):
    """The runner reads a GPT export's v_head_dim (written only where it differs)."""
    tok = CharTokenizer.from_text("abcdefgh ")
    cfg = dataclasses.replace(TINY, vocab_size=tok.vocab_size, n_head=3, qk_dim=12, v_dim=4)
    torch.manual_seed(0)
    checkpoint.save(tmp_path / "run", build(cfg), tok)
    run(pygpt.export.main, ["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "onnx")])
    runner = json.loads((tmp_path / "onnx" / "runner.json").read_text())
    assert (runner["head_dim"], runner["v_head_dim"]) == (12, 4)
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(tmp_path / "onnx"), "--prompt", "ab",
                           "--max-new-tokens", "5", "--greedy"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ab"), done.stderr


def test_a_pruned_classifier_classifies(files, tmp_path):  # noqa: F811
    src = tmp_path / "cls"
    run(pygpt.train.main, ["--arch", "bert", "--task", "classify", "--data", str(files[0]),
                           "--val-data", str(files[1]), "--out", str(src), "--vocab-size", "100",
                           "--n-layer", "2", "--n-embd", "32", "--n-head", "4", "--block-size",
                           "32", "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1",
                           "--batch-size", "8", "--quiet"])
    out = tmp_path / "pruned"
    prune(["--ckpt", src, "--out", out, "--head-fraction", "0.625", "--mlp-fraction", "0.5"])
    assert checkpoint.load_labels(out) == checkpoint.load_labels(src)
    assert sorted(checkpoint.load(out)[0].config.layer_heads) == [1, 2]
    lines = run(pygpt.classify.main, ["--ckpt", str(out), "--text", "a zebra"]).splitlines()
    assert lines[0] in ("yes", "no")
    report = run(pygpt.classify.main, ["--ckpt", str(out), "--data", str(files[1])])
    assert "macro-F1" in report


def test_a_pruned_translator_translates_and_exports(data, tmp_path):  # noqa: F811
    src = tmp_path / "mt"
    run(pygpt.train.main, ["--arch", "seq2seq", "--tokenizer", "char", "--n-layer", "1",
                           "--n-embd", "32", "--n-head", "4", "--block-size", "16",
                           "--max-tokens", "300", "--max-iters", "2", "--eval-interval", "2",
                           "--eval-iters", "1", "--bleu-sentences", "0", "--quiet", "--out",
                           str(src), *_pairs(data)])
    out = tmp_path / "pruned"
    prune(["--ckpt", src, "--out", out, "--heads-per-layer", "2", "--mlp-fraction", "0.5",
           "--src-data", data["val_src"], "--tgt-data", data["val_tgt"]])
    assert checkpoint.load(out)[0].config.n_head == 2
    assert run(pygpt.translate.main, ["--ckpt", str(out), "--text", "abc"]).strip() != ""
    run(pygpt.export.main, ["--ckpt", str(out), "--out", str(tmp_path / "onnx")])


@pytest.mark.parametrize("flags, message", [
    (["--heads-per-layer", "5"], "heads kept per layer must be 1 to n_head 4"),
    (["--heads-per-layer", "2", "--mlp-fraction", "1.5"], "must be in \\[0, 1\\)"),
    (["--heads-per-layer", "2", "--head-fraction", "0.5"], "not allowed with"),
    (["--head-fraction", "0.5", "--src-data", "x", "--tgt-data", "y"], "--src-data is for --arch seq2seq"),
    (["--head-fraction", "0.5", "--recover-iters", "-1"], "must not be negative"),
    (["--head-fraction", "0.5", "--data", "/no/such/file"], "no data file at /no/such/file"),
])
def test_bad_flags_are_one_line_errors(gpt, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        pygpt.prune.main(["--ckpt", str(gpt), "--out", str(out), *flags])
    if isinstance(e.value.code, str):  # ours: one line
        said = e.value.code
        assert "\n" not in said
    else:  # argparse's: its usage, then one error line
        said = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(message, said), said
    assert not out.exists()


def test_out_must_be_new_and_not_the_source(gpt, tmp_path):
    with pytest.raises(SystemExit, match="--out must differ from --ckpt"):
        pygpt.prune.main(["--ckpt", str(gpt), "--out", str(gpt), "--heads-per-layer", "2"])
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="error: .*busy"):
        pygpt.prune.main(["--ckpt", str(gpt), "--out", str(busy), "--heads-per-layer", "2"])
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
