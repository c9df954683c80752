"""The kernel sets a model can run on: ours (`ext`, the C++ ops of pygpt.ops) and plain PyTorch
(`torch`, the reference path and the benchmarks' baseline). Both have the same signatures and
semantics, so a model switches between them by name. Both are built from pygpt.ops.registry: each
op fills one slot (a field of `Kernels`) with its kernel in `ext` and its reference in `torch`.

Modules that call kernels, and the modules built around them (blocks, embeddings, models), derive
from KernelModule: setting `.kernels` on one (a whole model, or a single layer norm) switches it
and every kernel module inside it. `use_kernels(module, name)` does the same for any module, such
as a user's nn.Sequential of our blocks.
"""
from __future__ import annotations

from dataclasses import make_dataclass
from typing import Any, Callable

from torch import nn

from pygpt.config import KERNEL_SETS
from pygpt.ops.registry import OPS


Kernels = make_dataclass(
    "Kernels", [(op.slot, Callable[..., Any]) for op in OPS], frozen=True,
    namespace={"__module__": __name__,
               "__doc__": "A kernel set: one field per op of pygpt.ops.registry (its slot), so "
                          "that model code calls self.kern.<slot>(...)."})

KERNELS: dict[str, Kernels] = {
    "ext": Kernels(**{op.slot: op.kernel for op in OPS}),
    "torch": Kernels(**{op.slot: op.reference for op in OPS}),
}
assert tuple(KERNELS) == KERNEL_SETS, "pygpt.config.KERNEL_SETS names these kernel sets"


def kernels(name: str) -> Kernels:
    if name not in KERNELS:
        raise ValueError(f"unknown kernels {name!r}; choose from {', '.join(KERNELS)}")
    return KERNELS[name]


class KernelModule(nn.Module):
    """A module whose forward calls a kernel set, `self.kern` (ours by default)."""

    def __init__(self) -> None:
        super().__init__()
        self._kernels_name = KERNEL_SETS[0]
        self.kern = KERNELS[self._kernels_name]

    @property
    def kernels(self) -> str:
        """The name of the kernel set in use; setting it switches every kernel module inside."""
        return self._kernels_name

    @kernels.setter
    def kernels(self, name: str) -> None:
        use_kernels(self, name)


def use_kernels(module: nn.Module, name: str) -> None:
    """Runs every kernel module in module (itself included) on the named kernel set."""
    kern = kernels(name)
    for m in module.modules():
        if isinstance(m, KernelModule):
            m.kern, m._kernels_name = kern, name
