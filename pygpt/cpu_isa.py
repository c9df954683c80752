"""Which instruction set our CPU kernels run with.

The extension holds every CPU kernel compiled for several ISAs (on x86-64: `avx512`, `avx2` and
the baseline `base`) and picks, when it loads, the best one this CPU runs, as ATen does for its
own kernels. The environment variable PYGPT_CPU_ISA names one instead (a bad name, or one the
CPU cannot run, fails the import with the choices). Tests and benchmarks switch within one
process with `use`, e.g. to compare our AVX2 kernels with ATen's on an AVX-512 machine (start
that process with ATEN_CPU_CAPABILITY=avx2 and MKL_ENABLE_INSTRUCTIONS=AVX2).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch  # noqa: F401  (loads the torch libraries that _C links against)

from pygpt import _C


def active() -> str:
    """The ISA the CPU kernels run with now."""
    return _C.cpu_isa()


def built() -> list[str]:
    """The ISAs compiled into this build, best first."""
    return _C.built_cpu_isas()


def supported() -> list[str]:
    """The built ISAs this CPU can run, best first (`base` always)."""
    return _C.supported_cpu_isas()


def set_isa(name: str) -> None:
    """Runs the CPU kernels with `name` from now on (ValueError, naming the choices, when this
    build lacks it or this CPU cannot run it). Not for use while kernels run in other threads."""
    _C.use_cpu_isa(name)


@contextmanager
def use(name: str) -> Iterator[None]:
    """Runs the CPU kernels with `name` inside the block, then with the ISA before it."""
    before = active()
    set_isa(name)
    try:
        yield
    finally:
        set_isa(before)
