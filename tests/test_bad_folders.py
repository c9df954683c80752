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

from pygpt import checkpoint
from pygpt.config import MAX_NUMBERS, MAX_SIZES, ModelConfig
from pygpt.run_files import CONFIG, WEIGHTS


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
                                    dict(vocab_size=1 << 30)], ids=str)
def test_an_absurd_size_in_a_folder_is_one_line(ckpt, fields):
    set_model_fields(ckpt, **fields)
    name = next(iter(fields))
    assert name in one_error_line("--ckpt", str(ckpt), "--max-new-tokens", "1")


def test_sizes_that_disagree_with_the_weights_are_refused_before_building(ckpt, monkeypatch):
    """A context of a million learned positions is within the bounds, but the weights hold 16:
    load names the mismatch having built the model on the meta device only."""
    set_model_fields(ckpt, block_size=1_000_000)
    built = []
    real_build = checkpoint.build
    monkeypatch.setattr(checkpoint, "build", lambda cfg, kernels="ext": (
        built.append(torch.get_default_device().type), real_build(cfg, kernels))[1])
    with pytest.raises(ValueError, match=r"does not match config\.json: .*\(1000000, "):
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
