"""Small helpers shared by the test modules (tolerances, random inputs)."""

import torch

# (atol, rtol) per dtype. float32 results are compared against references evaluated in float64.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
}
ATTN_TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
}

DTYPES = [torch.float32, torch.float64]


def close(actual, expected, tol, msg="", rel_to_max=False):
    """assert_close against a (possibly higher-precision) reference, reporting the max error.

    rel_to_max: scale atol by max(1, max|expected|), for results that are long sums (e.g. weight
    gradients reduced over many rows) where elementwise relative error is meaningless near 0.
    """
    if rel_to_max:
        tol = dict(tol, atol=tol["atol"] * max(1.0, expected.detach().abs().max().item()))
    expected = expected.to(actual.dtype)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
    except AssertionError as e:
        finite = torch.isfinite(expected) & torch.isfinite(actual)
        err = (actual - expected)[finite].abs().max().item() if finite.any() else float("nan")
        raise AssertionError(f"{msg}: max abs error {err:.3e} ({actual.dtype}, shape "
                             f"{tuple(actual.shape)})\n{e}") from None


def f64(*ts):
    """Detached float64 copies that require grad (for the reference)."""
    out = tuple(t.detach().double().requires_grad_(t.requires_grad) for t in ts)
    return out if len(out) > 1 else out[0]


def rand(*shape, dtype=torch.float32, requires_grad=False, scale=1.0):
    t = torch.randn(*shape, dtype=dtype) * scale
    return t.requires_grad_(requires_grad)


def raises_naming(arg, what):
    """pytest.raises for a RuntimeError/ValueError whose message names `arg` (as a whole word,
    or as a prefix when arg ends with '*') and also matches the regex `what` (case-insensitive),
    which describes what was expected (dtype, shape, ...)."""
    import pytest

    name = rf"\b{arg[:-1]}" if arg.endswith("*") else rf"\b{arg}\b"
    return pytest.raises((RuntimeError, ValueError), match=rf"(?s)^(?=.*{name})(?=.*(?i:{what}))")


# Regexes for "what was expected" in error messages.
WHAT_DTYPE = r"float|double|dtype|type"
WHAT_RANK = r"dim|rank|\dd\b|\d-d|shape|size"
WHAT_SIZE = r"size|shape|dim|match|same|expect|must|but"
WHAT_DEVICE = r"cpu|device"
WHAT_RANGE = r"range|bound|valid|\[0|>=|<|class|index"


# --- tiny GPT models (test_gpt, test_decoding) ------------------------------------------------

import dataclasses  # noqa: E402  (only the GPT helpers below need these)

from pygpt.config import ModelConfig  # noqa: E402
from pygpt.config.presets import preset  # noqa: E402

V = 23  # vocabulary of the random-token tests

TINY = ModelConfig(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=32)

# Architectures every model equivalence test runs on: the default block, fixed sinusoidal
# positions, the score biases (a learned relative bias with distances past max_distance, and
# ALiBi on 3 heads, not a power of two), no biases / untied head with a bias, and the `seed`
# preset's shape (no MLP, residual, W_O, block norms; an embedding norm and std-1 embeddings) at
# a small vocabulary; and GPT-2's tanh GELU with a layer norm epsilon other than the default.
ARCHS = {
    "learned": TINY,
    "sinusoidal": dataclasses.replace(TINY, pos_encoding="sinusoidal"),
    "relative": dataclasses.replace(TINY, pos_encoding="relative", max_distance=5),
    "alibi": dataclasses.replace(TINY, pos_encoding="alibi", n_head=3, n_embd=24),
    "untied-nobias": dataclasses.replace(TINY, bias=False, tie_weights=False, head_bias=True,
                                         n_layer=1, n_head=4),
    "seed": dataclasses.replace(preset("seed").model, vocab_size=V),
    "gelu_tanh-eps": dataclasses.replace(TINY, activation="gelu_tanh", norm_eps=1e-3),
}


def make_model(cfg, kernels="ext", seed=0, spread=0.0):
    """A GPT from a fixed seed. `spread` adds N(0, spread) noise to every parameter, so that
    attention is far from uniform and logits are well separated (random init at std 0.02 makes
    every attention row nearly uniform, which would hide a wrong mask or scale)."""
    from pygpt.models import GPT  # here, so the kernel tests do not depend on the model

    torch.manual_seed(seed)
    model = GPT(cfg, kernels=kernels)
    return spread_(model, spread) if spread else model


def spread_(module, std=0.3):
    """Adds N(0, std) noise to every parameter of module, in place (layer norms away from
    identity, attention away from uniform), so that a wrong formula cannot hide behind a neutral
    initialisation. Returns module."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)
    return module


def twin(model, kernels):
    """A copy of model (same weights) running on the other kernels."""
    other = type(model)(model.config, kernels=kernels)
    other.load_state_dict(model.state_dict())
    return other


def rand_tokens(B, T, vocab=V, seed=1):
    return torch.randint(vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# --- Tiny training runs and checkpoint folders ------------------------------------------------
# Shared by test_train, test_checkpoint and test_cli (conftest.py builds its fixtures from them).

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from pygpt.config import ModelConfig, TrainConfig  # noqa: E402
from pygpt.storage.run_files import METRICS  # noqa: E402

TINY_MODEL = ModelConfig(block_size=8, n_layer=1, n_head=2, n_embd=16)
# The CLI flags of the same tiny run.
TINY_FLAGS = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
              "--max-iters", "5", "--eval-interval", "5", "--eval-iters", "2",
              "--batch-size", "4", "--quiet"]


def tiny_train_cfg(text_file, out, **overrides):
    base = dict(data=str(text_file), out=str(out), batch_size=4, max_iters=6, eval_interval=3,
                eval_iters=2, warmup_iters=2, lr=3e-3, min_lr=3e-4, seed=5)
    return TrainConfig(**{**base, **overrides})


def state_dicts_equal(a, b):
    """Asserts two state dicts hold the same names and bit-identical tensors."""
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs, max abs diff " \
                                              f"{(a[name] - b[name]).abs().max().item():.3e}"


def metrics(out):
    """The records of a run folder's metrics log."""
    return [json.loads(line) for line in (Path(out) / METRICS).read_text().splitlines()]


def edit_json(path, edit):
    """Rewrites the JSON file at path after edit(data) changed it in place."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def train_cli(args):
    """pygpt.train.main(args): (exit status, the SystemExit message or None)."""
    import pygpt.train

    try:
        pygpt.train.main(args)
    except SystemExit as e:
        return (e.code if isinstance(e.code, int) else 1), (e.code if isinstance(e.code, str)
                                                           else None)
    return 0, None


def snapshot(folder):
    """The files of folder (not below it) with their bytes: to prove a command changed none."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


import os  # noqa: E402  (the torch-free runner's tests)
import sys  # noqa: E402

# The torch-free runner's command line (pygpt-run, the console command of export/pygpt_runtime).
RUNNER_COMMAND = [sys.executable, "-m", "pygpt_runtime"]


def torch_free_env(tmp_path, blocked=("torch", "pygpt")):
    """The environment of a subprocess in which `import torch` and `import pygpt` (the modules
    blocked) fail (modules that raise, first on PYTHONPATH; the rest of PYTHONPATH stays), to
    prove the runner needs neither."""
    blocker = Path(tmp_path) / "blocked"
    blocker.mkdir()
    for name in blocked:
        (blocker / f"{name}.py").write_text(f"raise ImportError('{name} is not allowed here')\n")
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}
