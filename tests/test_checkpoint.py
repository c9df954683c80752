"""Checkpoint folders (pygpt.storage.checkpoint): save and load round trips bit for bit, new checkpoints
are format 3 (the model config names its family, arch "gpt"), format 1 checkpoints written
before the models were assembled from pygpt.nn still load to the same logits (and fine-tune and
resume from), damaged or mismatched files are clear errors instead of silently wrong models, a
training state from another step is never resumed, and a save that dies half-way leaves the
previous files whole."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import pygpt
import pygpt.generate
import pygpt.storage.serializers
import pygpt.train
from helpers import TINY_MODEL, edit_json, state_dicts_equal, tiny_train_cfg
from pygpt.storage import checkpoint, compat
from pygpt.config import TrainConfig
from pygpt.storage.atomic import atomic_write
from pygpt.models import GPT
from pygpt.nn import LayerNorm
from pygpt.storage.run_files import CONFIG, LOSS_PLOT, METRICS, TOKENIZER, TRAIN_STATE, WEIGHTS
from pygpt.tokenizer import CharTokenizer, load_tokenizer
from pygpt.training import make_optimizer, train

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Real checkpoints written by the format 1 code, each with the logits it gave for `ids`.
FORMAT1 = ["gpt-format1", "seed-format1"]


def WEIGHTS_MODE(folder, name=WEIGHTS):
    return (folder / name).stat().st_mode & 0o777


# --- round trip and format --------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["default", "sinusoidal-untied", "seed"])
def test_checkpoint_round_trip(tmp_path, arch):
    from pygpt.config.presets import preset

    tokenizer = CharTokenizer.from_text("hello, world!\nHELLO?")
    cfg = dict(default=TINY_MODEL,
               **{"sinusoidal-untied": dataclasses.replace(TINY_MODEL, pos_encoding="sinusoidal",
                                                           tie_weights=False, head_bias=True)},
               seed=preset("seed").model)[arch]
    cfg = dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(3)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = tmp_path / "ckpt"
    state = {"optimizer": make_optimizer(model, TrainConfig()).state_dict(), "tokens": 5,
             "data_rng": torch.Generator().get_state(), "torch_rng": torch.get_rng_state()}
    checkpoint.save(out, model, tokenizer, TrainConfig(out=str(out)), state=state, step=42)
    for name in ("config.json", "tokenizer.json", "model.safetensors", "train_state.pt"):
        assert (out / name).is_file(), name
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]

    for kernels in ("ext", "torch"):
        loaded, tok = pygpt.load(out, kernels=kernels)
        assert not loaded.training and loaded.kernels == kernels
        assert loaded.config == cfg
        assert tok.chars == tokenizer.chars
        state_dicts_equal(model.state_dict(), loaded.state_dict())
        if cfg.tie_weights:
            assert loaded.lm_head.weight is loaded.embed.tok.weight  # still tied after loading
        x = torch.tensor([tok.encode("hello, wor")[:cfg.block_size]])
        model.kernels = kernels
        assert torch.equal(loaded(x).logits, model(x).logits)

    config = json.loads((out / "config.json").read_text())
    assert config["step"] == 42 and config["format"] == checkpoint.FORMAT
    # Only the fields of the model's family are saved (a gpt: none of bert's or seq2seq's), and
    # the widths apart from n_embd and the per-layer sizes only where set.
    assert config["model"] == {k: v for k, v in dataclasses.asdict(cfg).items()
                               if k not in ("type_vocab_size", "nsp", "num_labels", "pooling",
                                            "n_dec_layer", "qk_dim", "v_dim", "mlp_dim",
                                            "layer_heads", "layer_mlp_dims")}
    assert config["train"]["out"] == str(out)
    assert checkpoint.weights_step(out) == 42
    loaded_state = checkpoint.load_train_state(out)
    assert loaded_state.keys() == {*state, "step"} and loaded_state["step"] == 42
    assert torch.equal(loaded_state["data_rng"], state["data_rng"])
    assert oct(WEIGHTS_MODE(out)) == oct(WEIGHTS_MODE(out, CONFIG))  # the umask's, not 0600


def test_new_checkpoint_is_format_3_with_its_arch(ckpt):
    """config.json and the weights' own metadata both record format 3 and the model family, and
    the weights are saved under today's names (none of format 1's)."""
    config = json.loads((ckpt / CONFIG).read_text())
    assert checkpoint.FORMAT == 3
    assert config["format"] == 3 and config["model"]["arch"] == "gpt"
    with safe_open(str(ckpt / WEIGHTS), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
    assert meta["format"] == "3" and meta["step"] == str(config["step"])
    assert json.loads(meta["model_config"]) == config["model"]
    assert json.loads(meta["model_config"])["arch"] == "gpt"
    assert "embed.pos.weight" in names
    assert names & {"embed.tok.weight", "lm_head.weight"}  # the tied pair, under either name
    assert not [n for n in names if n.startswith(tuple(compat.LEGACY_NAMES))]


def test_unknown_format_is_a_clear_error(ckpt, capsys):
    """A config.json from another (say, a future) format is refused by name, never guessed at:
    loading, resuming and the generate CLI all say which formats they read."""
    edit_json(ckpt / CONFIG, lambda c: c.update(format=99))
    message = r"not a pygpt checkpoint config \(format 1, 2 or 3\)"
    with pytest.raises(ValueError, match=message):
        pygpt.load(ckpt)
    with pytest.raises(ValueError, match=message):
        checkpoint.read_config(ckpt)
    with pytest.raises(SystemExit, match="^error: .*" + message):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])
    with pytest.raises(SystemExit, match="^error: .*" + message):
        pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", "First", "--max-new-tokens", "3"])
    assert capsys.readouterr().out == ""


def test_weights_of_an_unknown_format_are_refused(ckpt):
    """Weights whose own metadata names another format are not loaded as if they were ours."""
    from safetensors.torch import save_file

    with safe_open(str(ckpt / WEIGHTS), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = f.metadata()
    save_file(tensors, str(ckpt / WEIGHTS), metadata={**meta, "format": "99"})
    with pytest.raises(ValueError, match=r"weights format '99'.*format 1, 2 or 3"):
        pygpt.load(ckpt)


# --- format 1 checkpoints ---------------------------------------------------------------------

def recorded(name):
    """(ids, logits) the format 1 model of fixture `name` gave."""
    expected = load_file(str(FIXTURES / name / "expected_logits.safetensors"))
    return expected["ids"], expected["logits"]


def assert_recorded_logits(model, name):
    """To within float32 rounding: the format 1 code computed W_Q, W_K and W_V as three matmuls,
    pygpt now as one (pygpt.nn.fused_linear), whose sums round differently by an ulp or two; a
    misplaced weight would change the logits by orders of magnitude more."""
    ids, logits = recorded(name)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", FORMAT1)
def test_format1_checkpoint_gives_the_recorded_logits(name):
    config = json.loads((FIXTURES / name / CONFIG).read_text())
    assert config["format"] == 1 and "arch" not in config["model"]  # really the old format
    model, tok = pygpt.load(FIXTURES / name)
    assert isinstance(model, GPT) and model.config.arch == "gpt" and not model.training
    assert tok.vocab_size == model.config.vocab_size == 12
    # Saved before the layer norm epsilon was a setting: the 1e-5 every norm had then.
    assert "norm_eps" not in config["model"] and model.config.norm_eps == 1e-5
    assert {m.eps for m in model.modules() if isinstance(m, LayerNorm)} == {1e-5}
    if model.config.tie_weights:
        assert model.lm_head.weight is model.embed.tok.weight  # still tied after renaming
    assert_recorded_logits(model, name)
    # checkpoint.load (what resuming and fine-tuning load through) gives the same model.
    loaded, _ = checkpoint.load(FIXTURES / name, kernels="torch")
    assert loaded.kernels == "torch"
    state_dicts_equal(loaded.state_dict(), model.state_dict())


def fixture_text(tmp_path, name):
    """A text in the fixture's 12 characters, long enough for its context."""
    chars = load_tokenizer(FIXTURES / name / TOKENIZER).chars
    path = tmp_path / "text.txt"
    path.write_text("".join(chars[i * 7 % len(chars)] for i in range(400)), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", FORMAT1)
def test_fine_tune_from_format1_checkpoint(name, tmp_path, capsys):
    """--init-from a format 1 folder starts from its weights: with a learning rate of 0 the
    fine-tuned model is the old one exactly, saved in today's format, and the source is untouched."""
    before = {p.name: p.read_bytes() for p in (FIXTURES / name).iterdir()}
    out = tmp_path / "tuned"
    data = fixture_text(tmp_path, name)
    pygpt.train.main(["--init-from", str(FIXTURES / name), "--data", str(data), "--out", str(out),
                      "--batch-size", "2", "--max-iters", "1", "--eval-interval", "1",
                      "--eval-iters", "1", "--lr", "0", "--quiet", "--json"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["step"] == 1
    assert {p.name: p.read_bytes() for p in (FIXTURES / name).iterdir()} == before
    assert json.loads((out / CONFIG).read_text())["format"] == checkpoint.FORMAT
    assert_recorded_logits(pygpt.load(out)[0], name)


@pytest.mark.parametrize("name", FORMAT1)
def test_resume_a_format1_run(name, tmp_path):
    """A run saved by the format 1 code resumes: its weights load under their old names, the
    run continues, and the folder is rewritten in today's format (same weights with lr 0)."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / name, run)
    model, _ = checkpoint.load(run)
    cfg = TrainConfig(data=str(fixture_text(tmp_path, name)), out=str(run), batch_size=2,
                      max_iters=8, eval_interval=8, eval_iters=1, lr=0.0)
    # A training state of the kind the format 1 code saved beside its weights (the fixtures
    # hold only what loading needs): the step of the weights, a fresh optimizer, RNG states.
    torch.save({"optimizer": make_optimizer(model, cfg).state_dict(),
                "data_rng": torch.Generator().manual_seed(1).get_state(),
                "torch_rng": torch.get_rng_state(), "step": 7}, run / TRAIN_STATE)
    assert train(model.config, cfg, resume=True, progress=False)["step"] == 8
    config = json.loads((run / CONFIG).read_text())
    assert config["format"] == checkpoint.FORMAT and config["step"] == 8
    assert config["model"]["arch"] == "gpt"
    assert checkpoint.load_train_state(run)["step"] == 8
    assert_recorded_logits(pygpt.load(run)[0], name)


# --- bad checkpoints --------------------------------------------------------------------------

def test_missing_checkpoint_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        pygpt.load(tmp_path / "nowhere")


def test_folder_without_config(tmp_path, ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="not a checkpoint.*config.json"):
        pygpt.load(ckpt)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        pygpt.load(tmp_path)  # some other folder


@pytest.mark.parametrize("content, pattern", [
    ("{not json", "corrupt"),
    ('{"format": 99, "model": {}}', "not a pygpt checkpoint"),
    ("[1, 2]", "not a pygpt checkpoint"),
    ('{"format": 1, "model": {"n_embd": 16, "colour": "red"}}', "unknown ModelConfig keys"),
    ('{"format": 1, "model": {"n_embd": 15, "n_head": 2}}', "divisible"),
    ('{"format": 1, "model": null}', "invalid model config"),
])
def test_corrupt_config(ckpt, content, pattern):
    (ckpt / "config.json").write_text(content)
    with pytest.raises(ValueError, match=pattern):
        pygpt.load(ckpt)


@pytest.mark.parametrize("fraction", [0.5, 0.01, 0.0])
def test_truncated_weights(ckpt, fraction):
    weights = ckpt / WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ValueError, match="truncated, corrupt"):
        pygpt.load(ckpt)


def test_garbage_weights(ckpt):
    (ckpt / WEIGHTS).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(ValueError, match=WEIGHTS):
        pygpt.load(ckpt)


def test_missing_weights(ckpt):
    (ckpt / WEIGHTS).unlink()
    with pytest.raises(FileNotFoundError, match="no weights file"):
        pygpt.load(ckpt)


@pytest.mark.parametrize("edit, pattern", [
    (dict(n_embd=32), "does not match config.json: n_embd is 32 there but 16"),
    (dict(n_layer=2), "does not match config.json: n_layer is 2 there but 1"),
    (dict(block_size=16), "does not match config.json: block_size is 16 there"),
    (dict(pos_encoding="sinusoidal"), "does not match config.json: pos_encoding is 'sinusoidal'"),
    (dict(tie_weights=False), "does not match config.json: tie_weights is False"),
    (dict(mlp=False), "does not match config.json: mlp is False there but True"),
])
def test_config_weights_mismatch(ckpt, edit, pattern):
    edit_json(ckpt / "config.json", lambda c: c["model"].update(edit))
    with pytest.raises(ValueError, match=pattern):
        pygpt.load(ckpt)


def test_config_with_float_width(ckpt):
    edit_json(ckpt / "config.json", lambda c: c["model"].update(n_embd=16.0))
    with pytest.raises(ValueError, match="n_embd"):
        pygpt.load(ckpt)


def test_tokenizer_model_vocab_mismatch(ckpt):
    edit_json(ckpt / "tokenizer.json", lambda t: t["chars"].pop())
    with pytest.raises(ValueError, match="tokenizer has 51 tokens.*configured for 52"):
        pygpt.load(ckpt)


@pytest.mark.parametrize("content, error, pattern", [
    (None, FileNotFoundError, "no tokenizer"),
    ("{oops", ValueError, "not a valid tokenizer"),
    ('{"kind": "bpe", "merges": []}', ValueError, "unsupported tokenizer"),
    ('{"kind": "char", "chars": ["a", "a"]}', ValueError, "distinct"),
])
def test_bad_tokenizer_file(ckpt, content, error, pattern):
    path = ckpt / "tokenizer.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(error, match=pattern):
        pygpt.load(ckpt)
    if content is not None:
        with pytest.raises(error, match=pattern):
            load_tokenizer(path)


def test_train_state_from_another_step(ckpt, trained, text_file):
    """Saves are whole, so a training state of step 3 beside weights of step 6 was put there by
    hand: detected, never resumed."""
    (ckpt / TRAIN_STATE).write_bytes(trained[1])
    with pytest.raises(ValueError, match=r"step 3 but the weights from step 6.*different saves"):
        checkpoint.load_train_state(ckpt)
    cfg = tiny_train_cfg(text_file, ckpt, max_iters=9)
    with pytest.raises(ValueError, match="different saves"):
        train(TINY_MODEL, cfg, resume=True, progress=False)
    with pytest.raises(SystemExit, match="error: .*different saves"):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])
    pygpt.load(ckpt)  # the weights themselves are still usable for generation


def test_bad_train_state(ckpt):
    state = ckpt / TRAIN_STATE
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        checkpoint.load_train_state(ckpt)
    state.unlink()
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        checkpoint.load_train_state(ckpt)
    with pytest.raises(SystemExit, match="error: .*nothing to resume"):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])


# --- (f) atomic writes ------------------------------------------------------------------------

def test_crash_while_saving_weights_keeps_previous(ckpt, monkeypatch):
    """A save that dies half-way through writing the weights leaves the previous
    model.safetensors byte for byte, and no temporary file."""
    from safetensors.torch import save_model as real_save_model

    weights = ckpt / WEIGHTS
    before = weights.read_bytes()
    model, tok = pygpt.load(ckpt)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    seen = []

    def dying_save_model(model, filename, *args, **kwargs):
        real_save_model(model, filename, *args, **kwargs)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])  # half the file is on disk...
        seen.append(filename)
        raise OSError("No space left on device")  # ... when the write fails

    monkeypatch.setattr(pygpt.storage.serializers, "save_model", dying_save_model)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(ckpt, model, tok, step=99)
    assert seen and Path(seen[0]).parent.parent == ckpt  # written in a staging folder
    assert weights.read_bytes() == before
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        ["config.json", "tokenizer.json", "model.safetensors", "train_state.pt", METRICS,
         LOSS_PLOT])
    monkeypatch.undo()
    loaded, _ = pygpt.load(ckpt)  # the previous weights still load (same architecture)
    assert checkpoint.weights_step(ckpt) == 6


def test_crash_while_saving_train_state_keeps_previous(ckpt, monkeypatch):
    state = ckpt / TRAIN_STATE
    before = state.read_bytes()
    names = [p.name for p in ckpt.iterdir()]
    model, tok = pygpt.load(ckpt)
    real_torch_save = torch.save

    def dying_torch_save(obj, f, *args, **kwargs):
        real_torch_save(obj, f, *args, **kwargs)
        f.write(b"and half of another")
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(torch, "save", dying_torch_save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(ckpt, model, tok, state={"optimizer": {}}, step=7)
    monkeypatch.undo()
    assert state.read_bytes() == before
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(names)  # nothing staged is left
    # The weights of step 7 were staged but never committed: step 6 is whole and resumes.
    assert checkpoint.weights_step(ckpt) == 6 == checkpoint.load_train_state(ckpt)["step"]


def test_atomic_write_replaces_whole_or_nothing(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old contents")

    def partial(tmp):
        tmp.write_bytes(b"new con")
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        atomic_write(target, partial)
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]
    atomic_write(target, lambda tmp: tmp.write_bytes(b"new contents"))
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


# --- saves as a whole (pygpt.storage.atomic.FolderWrite), and damaged training states --------------------

def snapshot(folder):
    """Every path under folder with its bytes: to prove a reader wrote nothing."""
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_a_committed_save_reads_whole_before_it_is_moved_in(ckpt):
    """A save killed after its commit but before it moved its files: every reader sees the new
    checkpoint (from staging, writing nothing: a reader may not be allowed to), and recover
    moves it into place."""
    model, tok = pygpt.load(ckpt)
    with torch.no_grad():
        model.embed.pos.weight.add_(1.0)
    copy = ckpt.parent / "copy"
    state = checkpoint.load_train_state(ckpt)
    checkpoint.save(copy, model, tok, state=state, step=7)
    staging = ckpt / ".staging-1"
    shutil.copytree(copy, staging)
    (staging / "COMMITTED").write_text(json.dumps(
        {"written": [WEIGHTS, TRAIN_STATE, TOKENIZER, CONFIG], "remove": ["labels.json"],
         "index": CONFIG, "time_ns": 1}))
    (staging / WEIGHTS).rename(ckpt / WEIGHTS)  # the first file was moved before the kill
    before = snapshot(ckpt)
    assert checkpoint.read_config(ckpt)["step"] == 7 == checkpoint.weights_step(ckpt)
    assert checkpoint.load_train_state(ckpt)["step"] == 7
    state_dicts_equal(checkpoint.load(ckpt)[0].state_dict(), model.state_dict())
    assert snapshot(ckpt) == before
    checkpoint.recover(ckpt)
    assert not staging.exists() and json.loads((ckpt / CONFIG).read_text())["step"] == 7
    state_dicts_equal(checkpoint.load(ckpt)[0].state_dict(), model.state_dict())


def test_an_uncommitted_save_is_discarded(ckpt):
    staging = ckpt / ".staging-1"
    staging.mkdir()
    (staging / WEIGHTS).write_bytes(b"half a file")
    (ckpt / f".{CONFIG}.tmp-1").write_text("{")  # a killed atomic write
    assert checkpoint.weights_step(ckpt) == 6
    checkpoint.recover(ckpt)
    assert not staging.exists() and not (ckpt / f".{CONFIG}.tmp-1").exists()
    pygpt.load(ckpt)


def test_a_save_without_training_state_removes_the_old_one(ckpt):
    model, tok = pygpt.load(ckpt)
    checkpoint.save(ckpt, model, tok, step=8)
    assert not (ckpt / TRAIN_STATE).exists()
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        checkpoint.load_train_state(ckpt)


def test_config_and_weights_of_different_saves(ckpt, trained):
    """config.json of step 6 beside weights of another step: files of two saves, an error."""
    model, tok = pygpt.load(ckpt)
    copy = ckpt.parent / "copy"
    checkpoint.save(copy, model, tok, step=9)
    shutil.copy(copy / WEIGHTS, ckpt / WEIGHTS)
    with pytest.raises(ValueError, match=r"config.json is from step 6 but the weights from step "
                                         r"9: files of different saves"):
        pygpt.load(ckpt)


def test_config_and_weights_with_other_shapes(ckpt):
    """Weights whose tensors do not have the shapes of the model their metadata and config.json
    describe (edited by hand): one line naming the tensors."""
    from safetensors.torch import save_file

    with safe_open(str(ckpt / WEIGHTS), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = f.metadata()
    tensors["embed.pos.weight"] = tensors["embed.pos.weight"][:4].clone()
    save_file(tensors, str(ckpt / WEIGHTS), metadata=meta)
    with pytest.raises(ValueError, match=r"^\S+model.safetensors does not match config.json: "
                                         r"embed.pos.weight \(4, 16\) \(here \(8, 16\)\)$"):
        pygpt.load(ckpt)


@pytest.mark.parametrize("edit, pattern", [
    (lambda s: s.pop("optimizer"), "missing optimizer"),
    (lambda s: s.update(step="6"), "step must be a count"),
    (lambda s: s.update(tokens=-1), "tokens must be a count"),
    (lambda s: s.update(data_rng=torch.zeros(3)), "data_rng is no random generator state"),
    (lambda s: s.update(optimizer=[1, 2]), "optimizer must be an optimizer's state_dict"),
])
def test_hand_edited_train_state(ckpt, edit, pattern, capsys):
    state = torch.load(ckpt / TRAIN_STATE, weights_only=True)
    edit(state)
    torch.save(state, ckpt / TRAIN_STATE)
    with pytest.raises(ValueError, match=rf"{TRAIN_STATE} is not a pygpt training state: "
                                         rf"{pattern}"):
        checkpoint.load_train_state(ckpt)
    with pytest.raises(SystemExit, match="^error: [^\n]*" + pattern):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])


@pytest.mark.parametrize("edit, pattern", [
    (lambda o: o["state"][0].update(exp_avg=torch.zeros(3)), "exp_avg of parameter 0 does"),
    (lambda o: o["state"].update({99: {}}), "an entry 99 for no parameter"),
    (lambda o: o["param_groups"].pop(), "does not have the model's groups"),
])
def test_optimizer_state_that_does_not_fit(ckpt, edit, pattern):
    """Loaded into the run's optimizer, a saved state of other shapes is a clear error, never
    a traceback at the first step."""
    state = torch.load(ckpt / TRAIN_STATE, weights_only=True)
    edit(state["optimizer"])
    torch.save(state, ckpt / TRAIN_STATE)
    model, _ = checkpoint.load(ckpt)
    optimizer = make_optimizer(model, TrainConfig())
    with pytest.raises(ValueError, match=rf"{TRAIN_STATE}: the optimizer[^\n]*{pattern}"):
        checkpoint.load_train_state(ckpt, optimizer)
