"""Checkpoint folders and flags that ask for absurd sizes or hold broken models, where a user
meets them: a config.json (and the weights' own record of it) edited to a huge context or
width is refused in one line before any model is built, a size flag past ModelConfig's bounds is
one `error:` line, and the commands fail in one line on bad input (threads, text that is not
UTF-8, a tokenizer without [UNK]) or a model whose outputs are not finite numbers."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pygpt.storage import checkpoint
from pygpt.config import MAX_NUMBERS, MAX_SIZES, ModelConfig
from pygpt.storage.run_files import CONFIG, WEIGHTS


def set_model_fields(folder, **fields):
    """Edits the model config of folder's config.json and of its weights' metadata alike, as a
    hostile hand would to get past the check that the two agree."""
    config = json.loads((folder / CONFIG).read_text())
    config["model"].update(fields)
    (folder / CONFIG).write_text(json.dumps(config))
    weights = folder / WEIGHTS
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata()
    recorded = json.loads(metadata["model_config"])
    recorded.update(fields)
    save_file(load_file(str(weights)), str(weights),
              metadata={**metadata, "model_config": json.dumps(recorded)})


def one_error_line(*argv, module="pygpt.generate"):
    """The single stderr line a command exits 1 with (no traceback, nothing on stdout)."""
    done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True,
                          timeout=300)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 1 and "Traceback" not in err, err
    assert done.stdout == b"", done.stdout
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- sizes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [dict(block_size=1_000_000_000),
                                    dict(n_embd=1 << 20, n_head=1),
                                    dict(layer_heads=[1] * 7), dict(layer_mlp_dims="wide"),
                                    dict(vocab_size=1 << 30)], ids=str)
def test_an_absurd_size_in_a_folder_is_one_line(ckpt, fields):
    set_model_fields(ckpt, **fields)
    name = next(iter(fields))
    assert name in one_error_line("--ckpt", str(ckpt), "--max-new-tokens", "1")


def test_per_layer_sizes_that_disagree_with_the_weights_are_refused_before_building(
        ckpt, monkeypatch):
    """MLP widths of each layer that are in range but not the weights': named, having built
    the model on the meta device only."""
    n_layer = json.loads((ckpt / CONFIG).read_text())["model"]["n_layer"]
    set_model_fields(ckpt, layer_mlp_dims=[3] * n_layer)
    refused_on_meta_only(ckpt, monkeypatch, r"does not match config\.json: .*mlp\.fc\.weight")


def test_sizes_that_disagree_with_the_weights_are_refused_before_building(ckpt, monkeypatch):
    """A context of a million learned positions is within the bounds, but the weights hold 16:
    load names the mismatch having built the model on the meta device only."""
    set_model_fields(ckpt, block_size=1_000_000)
    refused_on_meta_only(ckpt, monkeypatch, r"does not match config\.json: .*\(1000000, ")


def refused_on_meta_only(ckpt, monkeypatch, match: str) -> None:
    """checkpoint.load(ckpt) raises a ValueError matching `match`, having built the model on
    the meta device only (no memory allocated from the folder's sizes)."""
    built = []
    real_build = checkpoint.build
    monkeypatch.setattr(checkpoint, "build", lambda cfg, kernels="ext": (
        built.append(torch.get_default_device().type), real_build(cfg, kernels))[1])
    with pytest.raises(ValueError, match=match):
        checkpoint.load(ckpt)
    assert built == ["meta"]


@pytest.mark.parametrize("flag, value", [("--block-size", "1000000000"),
                                         ("--n-layer", "100000"),
                                         ("--vocab-size", "1000000000")])
def test_an_absurd_size_flag_is_one_line(tmp_path, flag, value):
    line = one_error_line(flag, value, "--tokenizer", "bpe", "--out", str(tmp_path / "run"),
                          module="pygpt.train")
    assert flag[2:].replace("-", "_") in line and "at most" in line


def test_the_bounds_stop_the_tables_a_config_allocates():
    with pytest.raises(ValueError, match="numbers"):
        ModelConfig(n_embd=1 << 16, n_head=1)
    with pytest.raises(ValueError, match="numbers"):
        ModelConfig(pos_encoding="rotary", block_size=MAX_SIZES["block_size"], n_layer=64)
    assert ModelConfig(pos_encoding="sinusoidal", block_size=MAX_SIZES["block_size"],
                       n_embd=128).numbers <= MAX_NUMBERS


# --- bad input and broken models at the command lines ---------------------------------------------

TEXT = "to be or not to be that is the question whether tis nobler in the mind " * 20


def bert_folder(folder, num_labels=0):
    """A small untrained BERT (WordPiece) saved into folder: a classifier with num_labels."""
    from pygpt.families import build
    from pygpt.tokenizer import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.train(TEXT, 60)
    model = build(ModelConfig(arch="bert", vocab_size=tokenizer.vocab_size, block_size=16,
                              n_layer=1, n_head=2, n_embd=16, num_labels=num_labels))
    labels = [f"l{i}" for i in range(num_labels)] if num_labels else None
    checkpoint.save(folder, model.eval(), tokenizer, labels=labels)
    return folder


def translator_folder(folder):
    from seq2seq_helpers import reverser, tokenizer

    checkpoint.save(folder, reverser(steps=0), tokenizer())
    return folder


def poison_weights(folder, how):
    """Damages the folder's model, keeping the file's metadata: `nan` sets one weight to NaN;
    `overflow` sets every layer norm's gain to 3e38, finite but overflowing float32 in the
    layer after it, so the weights pass the load check and the outputs become infinities."""
    weights = folder / WEIGHTS
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    if how == "nan":
        name = sorted(n for n, t in tensors.items() if t.is_floating_point())[0]
        tensors[name].view(-1)[0] = float("nan")
    else:
        gains = [n for n in tensors if "norm" in n and n.endswith(".weight")]
        assert gains, sorted(tensors)
        for name in gains:
            tensors[name].fill_(3e38)
    save_file(tensors, str(weights), metadata=metadata)


@pytest.mark.parametrize("how", ["nan", "overflow"])
@pytest.mark.parametrize("module,greedy", [("generate", False), ("generate", True),
                                           ("translate", False), ("translate", True),
                                           ("fill_mask", False), ("classify", False)])
def test_damaged_weights_are_one_line_in_every_command(ckpt, tmp_path, module, how, greedy):
    folder = {"generate": lambda: ckpt, "translate": lambda: translator_folder(tmp_path / "mt"),
              "fill_mask": lambda: bert_folder(tmp_path / "bert"),
              "classify": lambda: bert_folder(tmp_path / "cls", num_labels=2)}[module]()
    poison_weights(folder, how)
    text = {"generate": ["--max-new-tokens", "5", "--prompt", "a"], "translate": ["--text", "abc"],
            "fill_mask": ["--text", "to be [MASK]"], "classify": ["--text", "to be"]}[module]
    text += ["--greedy"] if greedy else []
    if module == "generate" and how == "overflow":  # the prompt is printed before sampling
        done = subprocess.run([sys.executable, "-m", "pygpt.generate", "--ckpt", str(folder),
                               *text], capture_output=True, timeout=300)
        err = done.stderr.decode()
        assert done.returncode == 1 and done.stdout == b"a\n", (done.stdout, err)
        assert err.count("\n") == 1 and err.startswith("error: "), err
        line = err.strip()
    else:
        line = one_error_line("--ckpt", str(folder), *text, module=f"pygpt.{module}")
    assert "NaN or infinity" in line


def test_threads_zero_is_one_line(ckpt, tmp_path):
    assert "--threads" in one_error_line("--ckpt", str(ckpt), "--threads", "0")
    mt = translator_folder(tmp_path / "mt")
    assert "--threads" in one_error_line("--ckpt", str(mt), "--text", "ab", "--threads", "0",
                                         module="pygpt.translate")


def test_translate_refuses_text_that_is_not_utf8(tmp_path):
    mt = translator_folder(tmp_path / "mt")
    line = one_error_line("--ckpt", str(mt), "--text", b"ab\xff", module="pygpt.translate")
    assert line == "error: --text is not valid UTF-8 (byte 0xff at character 2)"


def drop_unk(folder):
    """Renames the [UNK] of the WordPiece in folder: a tokenizer that cannot encode every word."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        if token["content"] == "[UNK]":
            token["content"] = "[UNX]"
    spec["model"]["vocab"]["[UNX]"] = spec["model"]["vocab"].pop("[UNK]")
    (folder / "tokenizer.json").write_text(json.dumps(spec))


def test_fill_mask_with_a_wordpiece_without_unk_is_one_line(tmp_path):
    folder = bert_folder(tmp_path / "bert")
    drop_unk(folder)
    line = one_error_line("--ckpt", str(folder), "--text", "zq€ [MASK]", module="pygpt.fill_mask")
    assert "[UNK]" in line


def test_num_labels_without_labels_is_one_line(tmp_path):
    # --quiet: a run refused once started reports nothing of its start on stdout.
    line = one_error_line("--arch", "bert", "--num-labels", "3", "--out", str(tmp_path / "r"),
                          "--max-iters", "1", "--quiet", module="pygpt.train")
    assert "num_labels" in line


class Pickled:
    def __reduce__(self):
        return (print, ("ran",))


def test_a_pickled_object_in_the_training_state_is_refused_in_one_line(ckpt):
    torch.save({"step": 6, "x": Pickled()}, ckpt / "train_state.pt")
    line = one_error_line("--resume", "--out", str(ckpt), "--max-iters", "8", "--quiet",
                          module="pygpt.train")
    assert "train_state.pt" in line and "weights_only" not in line


def test_classify_with_a_wordpiece_without_unk_is_one_line(tmp_path):
    import pygpt.classify

    folder = bert_folder(tmp_path / "cls", num_labels=2)
    drop_unk(folder)
    with pytest.raises(SystemExit) as e:
        pygpt.classify.main(["--ckpt", str(folder), "--text", "zq€ ab"])
    line = str(e.value.code)
    assert line.startswith("error: ") and "\n" not in line and "[UNK]" in line
