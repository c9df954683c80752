"""The divergence guard and the settings that would diverge: flags that can only break a run
(negative warmup, a nan clip, an infinite rate, no threads...) are refused with one line before
anything is read or written; a non-finite loss or gradient norm stops the run before the optimizer
steps, and non-finite weights are never saved, so the last checkpoint is kept as it was."""

import types
from typing import NamedTuple

import pytest
import torch
from torch import nn

import pygpt.train
import pygpt.training.loop as loop
from helpers import TINY_FLAGS, TINY_MODEL, snapshot, tiny_train_cfg
from pygpt.storage.run_files import WEIGHTS
from pygpt.training import train
from pygpt.training.step import Diverged, check_finite_weights, train_step


@pytest.fixture
def run(text_file, tmp_path):
    out = tmp_path / "run"
    pygpt.train.main(TINY_FLAGS + ["--threads", "1", "--data", str(text_file), "--out", str(out)])
    return out


@pytest.mark.parametrize("flag, value, name", [
    ("--warmup-iters", "-3", "warmup_iters"), ("--grad-clip", "nan", "grad_clip"),
    ("--grad-clip", "-1", "grad_clip"), ("--lr", "inf", "lr"), ("--lr", "nan", "lr"),
    ("--lr", "-1e-3", "lr"), ("--min-lr", "inf", "min_lr"), ("--weight-decay", "nan",
                                                              "weight_decay"),
    ("--beta2", "1", "beta2"), ("--beta1", "-0.1", "beta1"), ("--threads", "0", "threads"),
    ("--lr-decay-iters", "0", "lr_decay_iters"), ("--eval-iters", "0", "eval_iters"),
])
def test_bad_settings_are_refused_with_one_line(run, flag, value, name):
    before = snapshot(run)
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(["--resume", "--out", str(run), "--max-iters", "8", "--quiet",
                          f"{flag}={value}"])
    message = info.value.code
    assert isinstance(message, str) and message.startswith(f"error: {name} ")
    assert "\n" not in message
    assert snapshot(run) == before


def test_a_diverging_resume_exits_and_keeps_the_checkpoint(run):
    """A huge (but finite) rate turns the weights to garbage within two steps: the run stops
    with an error before any non-finite state is saved."""
    before = snapshot(run)
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(["--resume", "--out", str(run), "--max-iters", "20", "--quiet",
                          "--lr", "1e30", "--eval-interval", "1"])
    message = info.value.code
    assert isinstance(message, str) and message.startswith("error: training diverged at step ")
    assert "the checkpoint of step 5" in message and "unchanged" in message
    assert snapshot(run) == before


class SqrtModel(nn.Module):
    """loss = sum(sqrt(w)): finite (0) at w = 0, where its gradient is infinite."""

    def __init__(self, value):
        super().__init__()
        self.w = nn.Parameter(torch.full((3,), value))

    def forward(self, x):
        return types.SimpleNamespace(loss=torch.sqrt(self.w * x).sum())


class Batch(NamedTuple):
    x: torch.Tensor


@pytest.mark.parametrize("grad_clip", [0.0, 1.0])
@pytest.mark.parametrize("value, x", [(0.0, 1.0), (1.0, float("nan")), (-1.0, 1.0)])
def test_train_step_refuses_non_finite_loss_or_gradients(grad_clip, value, x):
    """Infinite gradients with a finite loss, a nan loss, a nan loss from a negative sqrt: the
    weights and optimizer state stay as they were and the gradients are cleared."""
    model = SqrtModel(value)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = model.w.detach().clone()
    with pytest.raises(Diverged, match="not finite|nan|inf"):
        train_step(model, optimizer, [Batch(torch.full((3,), x))], 0.1, grad_clip)
    assert torch.equal(model.w.detach(), before)
    assert optimizer.state_dict()["state"] == {} and model.w.grad is None
    # A finite step still steps.
    model = SqrtModel(1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert train_step(model, optimizer, [Batch(torch.ones(3))], 0.1, grad_clip) == pytest.approx(3.0)
    assert not torch.equal(model.w.detach(), torch.ones(3))


def test_check_finite_weights_names_the_parameter():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    check_finite_weights(model)
    with torch.no_grad():
        model[1].bias[0] = float("inf")
        model[0].weight[0, 0] = float("nan")
    with pytest.raises(Diverged, match=r"0\.weight and 1 more"):
        check_finite_weights(model)


@pytest.mark.parametrize("resume", [False, True])
def test_non_finite_weights_are_never_saved(text_file, tmp_path, monkeypatch, resume):
    """Weights that go non-finite in the step before a save (the loss of that step was still
    finite) stop the run instead of being written: nothing saved, or the last checkpoint kept."""
    out = tmp_path / "run"
    cfg = tiny_train_cfg(text_file, out, max_iters=3, eval_interval=3)
    if resume:
        train(TINY_MODEL, cfg, progress=False)
    before = snapshot(out) if resume else None
    real = loop.train_step

    def poisoned(model, *args, **kwargs):
        loss = real(model, *args, **kwargs)
        with torch.no_grad():
            next(model.parameters())[0] = float("inf")
        return loss

    monkeypatch.setattr(loop, "train_step", poisoned)
    step = 4 if resume else 1
    with pytest.raises(Diverged, match=rf"diverged at step {step}: the weights of .* not finite"):
        train(TINY_MODEL, tiny_train_cfg(text_file, out, max_iters=6, eval_interval=1),
              resume=resume, progress=False)
    if resume:
        assert snapshot(out) == before
    else:
        assert not (out / WEIGHTS).exists()


def test_a_new_run_diverging_at_once_saves_nothing(text_file, tmp_path):
    """A rate so large that the first evaluation's loss is huge (its perplexity overflows) or
    nan: an error line, no checkpoint, and the folder the run created is gone again."""
    for lr in ("1e3", "1e20"):
        out = tmp_path / f"lr{lr}"
        with pytest.raises(SystemExit) as info:
            pygpt.train.main(TINY_FLAGS + ["--threads", "1", "--data", str(text_file), "--out",
                                           str(out), "--lr", lr, "--warmup-iters", "0",
                                           "--eval-interval", "1"])
        message = info.value.code
        assert isinstance(message, str), message
        assert message.startswith("error: training diverged at step 1: the evaluation's train")
        assert "nothing was saved" in message and not out.exists()
