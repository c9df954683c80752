"""pygpt's kernels as differentiable PyTorch ops: attention, layer_norm, cross_entropy, rotary,
the fused bias_gelu and add_layer_norm, and the fused LM head + loss linear_cross_entropy.

Importing this package loads the compiled extension `pygpt._C`, which registers
`torch.ops.pygpt.*`. Each op has one home on each side:

- pygpt/ops/<op>.py: the public function (which returns only the result, while the raw op also
  returns what its backward needs: the log-sum-exp rows, the layer norm statistics), the fake
  implementations of the raw ops (so the ops work under `torch.library.opcheck`,
  `torch.compile` and export), the plain-PyTorch reference (the "torch" kernel set, the
  benchmarks' baseline) and the translation to standard ONNX ops (onnxscript is imported only
  when an export runs: pygpt.ops.onnx_opset); pygpt/ops/fake_support.py holds what the fakes
  share;
- csrc/bindings/<op>.cpp: the op's schemas (forward and backward), its argument checks at the
  op boundary and its autograd (a C++ torch::autograd::Function that calls the op's own backward
  kernel, so that no Python runs per op call in training); beside it <op>_cpu.cpp and
  <op>_cuda.cpp register its kernels for the CPU and CUDA dispatch keys (CUDA only in a CUDA
  build);
- csrc/cpu/ and csrc/cuda/: the kernels' math, framework-free (pointers and sizes in), so each
  compiles and is tested on its own (tests/native; the CUDA ones also on a host emulator of CUDA);
  csrc/common/: what both share (the attention shape).

pygpt.ops.registry is the list of the ops, which pygpt.kernels, the ONNX exporter, the tests and
CI read. linear_cross_entropy (csrc/bindings/linear_cross_entropy.cpp) is composed of ATen's
matmuls and the cross-entropy ops, one composite C++ implementation for every device, so it has
no kernels of its own.
"""
from __future__ import annotations

from pygpt.ops.add_layer_norm import add_layer_norm
from pygpt.ops.attention import attention
from pygpt.ops.bias_gelu import bias_gelu
from pygpt.ops.cross_entropy import cross_entropy
from pygpt.ops.layer_norm import layer_norm
from pygpt.ops.linear_cross_entropy import linear_cross_entropy
from pygpt.ops.registry import OPS
from pygpt.ops.rotary import rotary

__all__ = [op.name for op in OPS]
