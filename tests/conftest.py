"""Shared pytest setup: one intra-op thread and fixed seeds, so results are stable and
reproducible on a small, busy machine."""

import random

import pytest
import torch

# Every test runs single-threaded unless it explicitly asks for more (see `two_threads`).
torch.set_num_threads(1)


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
