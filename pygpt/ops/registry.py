"""The list of pygpt's ops: one `Op` per op, in the order of pygpt.ops's __all__. Everything that
needs the list of ops reads it here: pygpt.ops's __all__, the kernel sets (pygpt.kernels: one
slot per op), the ONNX exporter's translation table (pygpt.onnx.graph), the op-contract tests,
and CI's check that a CUDA build registers every op's CUDA kernel.

Adding an op: its module pygpt/ops/<op>.py (public function, fakes, plain-PyTorch reference,
ONNX translation), its import in pygpt/ops/__init__.py, and its entry here; its C++ lives in
csrc/ (see pygpt.ops)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from pygpt.ops.add_layer_norm import (add_layer_norm, add_layer_norm_onnx,
                                      torch_add_layer_norm)
from pygpt.ops.attention import attention, attention_onnx, torch_attention
from pygpt.ops.bias_gelu import bias_gelu, bias_gelu_onnx, ext_linear_gelu, torch_linear_gelu
from pygpt.ops.cross_entropy import cross_entropy, torch_cross_entropy
from pygpt.ops.layer_norm import layer_norm, layer_norm_onnx, torch_layer_norm
from pygpt.ops.linear_cross_entropy import linear_cross_entropy, torch_linear_cross_entropy
from pygpt.ops.rotary import rotary, rotary_onnx, torch_rotary


@dataclass(frozen=True)
class Op:
    name: str  # pygpt.ops.<name>, and its raw forward op torch.ops.pygpt.<name>
    backward: Optional[str]  # the raw backward op, if it has its own
    function: Callable  # the public function, pygpt.ops.<name>
    slot: str  # the kernel sets' field it fills (pygpt.kernels.Kernels): self.kern.<slot>
    kernel: Callable  # what fills the slot in our kernel set ("ext")
    reference: Callable  # what fills it in the plain-PyTorch one ("torch")
    onnx: Optional[Callable]  # the raw forward op's ONNX translation; None: never exported
    cuda: bool  # a CUDA build registers a CUDA kernel for each of its raw ops

    @property
    def raw_ops(self) -> tuple[str, ...]:
        """The names of the torch.ops.pygpt ops it registers."""
        return (self.name,) if self.backward is None else (self.name, self.backward)


OPS: tuple[Op, ...] = (
    Op("attention", "attention_backward", attention, "attention", attention, torch_attention,
       attention_onnx, cuda=True),
    Op("layer_norm", "layer_norm_backward", layer_norm, "layer_norm", layer_norm,
       torch_layer_norm, layer_norm_onnx, cuda=True),
    Op("cross_entropy", "cross_entropy_backward", cross_entropy, "cross_entropy", cross_entropy,
       torch_cross_entropy, None, cuda=True),
    # Its backward is the forward op with inverse=True.
    Op("rotary", None, rotary, "rotary", rotary, torch_rotary, rotary_onnx, cuda=True),
    # The MLP's widening: gelu(x W^T + b), the bias and the GELU in our kernel after the matmul.
    Op("bias_gelu", "bias_gelu_backward", bias_gelu, "linear_gelu", ext_linear_gelu,
       torch_linear_gelu, bias_gelu_onnx, cuda=True),
    Op("add_layer_norm", "add_layer_norm_backward", add_layer_norm, "add_layer_norm",
       add_layer_norm, torch_add_layer_norm, add_layer_norm_onnx, cuda=True),
    # The LM head and its loss, fused: composed (in C++) of matmuls and the cross_entropy ops,
    # so it runs wherever they do (no kernel of its own); its forward returns the gradients
    # too, so it has no backward op. No exported graph computes a loss.
    Op("linear_cross_entropy", None, linear_cross_entropy, "linear_cross_entropy",
       linear_cross_entropy, torch_linear_cross_entropy, None, cuda=False),
)

