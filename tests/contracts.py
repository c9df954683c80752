"""What tests/test_op_contract.py checks for every op: a `Contract` per op (its tensor arguments,
options, valid inputs, bad-input cases and the argument moved off the CPU), and how each caller
(the public pygpt.ops wrapper, the raw torch.ops.pygpt op, the CPU kernel directly) calls it."""

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

import pygpt.ops

CALLERS = ("public", "raw")
CPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


class Bad(NamedTuple):
    args: tuple  # the op's tensor arguments, one or more of them bad
    arg: str  # the argument the error must name (a prefix when it ends with '*')
    what: str  # regex for what was expected (helpers.WHAT_*)
    # A type only the raw op refuses: the public function computes it in float32 and returns
    # the input's type (pygpt.ops.precision).
    raw_only: bool = False


@dataclass(frozen=True)
class Contract:
    name: str  # pygpt.ops.<name> and torch.ops.pygpt.<name>
    arg_names: tuple  # names of the tensor arguments, in order
    options: tuple  # the raw op's non-tensor arguments: the public wrapper's defaults
    good: Callable[[], tuple]  # valid tensor arguments
    bad: dict  # case name -> Bad
    off_device: str  # the argument moved to the meta device in test_bad_device
    # Trailing tensor arguments that the public wrapper takes by keyword and the raw op after
    # the options (attention's lengths and position biases); `label` tells such a contract from
    # the op's plain one.
    keywords: tuple = ()
    label: str = ""

    @property
    def key(self) -> str:
        return self.label or self.name

    def call(self, caller, *tensors):
        op = getattr(torch.ops.pygpt, self.name)
        n = len(tensors) - len(self.keywords)
        positional, by_keyword = tensors[:n], tensors[n:]
        if caller == "public":
            return getattr(pygpt.ops, self.name)(*positional,
                                                  **dict(zip(self.keywords, by_keyword)))
        args = (*positional, *self.options, *by_keyword)
        if caller == "raw":
            return op(*args)
        assert caller == "cpu_kernel", caller
        return op.default.redispatch(CPU_KERNEL, *args)
