"""Shared pytest setup: one intra-op thread and fixed seeds, so results are stable and
reproducible on a small, busy machine."""

import random
import signal

import pytest
import torch

# Every test runs single-threaded unless it explicitly asks for more (see `two_threads`).
torch.set_num_threads(1)

# A suite started in the background of a non-interactive shell (`pytest &`) inherits SIGINT
# ignored, and so would every command it starts: the tests of Ctrl-C need it delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _fixed_state():
    """Fixed seeds for each test, and restore the thread count afterwards in case a test changed it."""
    torch.manual_seed(0)
    random.seed(0)
    yield
    torch.set_num_threads(1)


@pytest.fixture
def two_threads():
    """Use to run part of a test on two intra-op threads; call it as a context-free switch:

        two_threads(True)   # 2 threads
        two_threads(False)  # back to 1
    """

    def switch(on):
        torch.set_num_threads(2 if on else 1)

    yield switch
    torch.set_num_threads(1)


# --- A tiny trained run, shared by test_train, test_checkpoint and test_cli -------------------

@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    """The first 3000 characters of the shipped Shakespeare (52 distinct characters)."""
    from pygpt.data.text import SHIPPED_TEXT

    path = tmp_path_factory.mktemp("data") / "shakespeare.txt"
    path.write_text(SHIPPED_TEXT.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def trained(text_file, tmp_path_factory):
    """A finished tiny run (steps 3 and 6 checkpointed), plus the step-3 train_state kept aside.
    Trained once per session and never written to: tests that damage a checkpoint use `ckpt`."""
    import dataclasses

    from helpers import TINY_MODEL, tiny_train_cfg
    from pygpt.storage.run_files import TRAIN_STATE
    from pygpt.training import train

    out = tmp_path_factory.mktemp("trained") / "run"
    cfg = tiny_train_cfg(text_file, out, max_iters=3)
    train(TINY_MODEL, cfg, progress=False)
    step3_state = (out / TRAIN_STATE).read_bytes()
    train(TINY_MODEL, dataclasses.replace(cfg, max_iters=6), resume=True, progress=False)
    return out, step3_state


@pytest.fixture
def ckpt(trained, tmp_path):
    """A copy of the trained run's folder, free to damage."""
    import shutil

    dst = tmp_path / "ckpt"
    shutil.copytree(trained[0], dst)
    return dst
