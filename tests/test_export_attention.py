"""The ONNX translation of pygpt.ops.attention (pygpt.export.TRANSLATIONS): exported on its own
with and without per-row lengths, run in onnxruntime at other batch sizes and lengths than it was
traced with, against the op in PyTorch. With lengths the mask is built in the graph; NaN in the
padding must not reach the result."""

import warnings

import numpy as np
import pytest
import torch

import pygpt.ops
from pygpt import export as exporter
from test_attention_padded import padded_inputs

ort = pytest.importorskip("onnxruntime")

H, DK, DV = 2, 16, 24  # fixed in a graph; batch and lengths are dynamic
# (Tq, Tk, q_lengths, kv_lengths): self-attention, longer and shorter keys, a decode step.
CASES = [(37, 37, [37, 1, 0, 20], [37, 1, 0, 20]), (12, 130, [12, 3, 0, 12], [130, 65, 9, 0]),
         (40, 9, [40, 17, 5, 1], [9, 3, 9, 1]), (1, 100, [1, 1, 0], [100, 7, 50])]


class Attention(torch.nn.Module):
    def __init__(self, causal, lengths):
        super().__init__()
        self.causal, self.lengths = causal, lengths

    def forward(self, q, k, v, q_lengths, kv_lengths):
        if not self.lengths:
            return pygpt.ops.attention(q, k, v, causal=self.causal)
        return pygpt.ops.attention(q, k, v, causal=self.causal, q_lengths=q_lengths,
                                   kv_lengths=kv_lengths)


def export(module, tmp_path):
    from torch.export import Dim

    batch, tq, tk = Dim("batch", min=1, max=64), Dim("tq", min=1, max=512), Dim("tk", min=1, max=512)
    example = padded_inputs(H, 9, 11, DK, DV, [9, 4, 0], [11, 2, 5], torch.float32)
    dynamic = ({0: batch, 2: tq}, {0: batch, 2: tk}, {0: batch, 2: tk}, {0: batch}, {0: batch})
    path = tmp_path / "attention.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example, None, input_names=["q", "k", "v", "q_lengths", "kv_lengths"],
            output_names=["out"], dynamic_shapes=dynamic,
            custom_translation_table=exporter.TRANSLATIONS, opset_version=exporter.OPSET,
            dynamo=True, external_data=False, optimize=True, verbose=False)
    program.save(str(path), external_data=False)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("causal", [True, False])
def test_padded_attention_in_onnxruntime(causal, tmp_path):
    session = export(Attention(causal, lengths=True), tmp_path)
    names = [i.name for i in session.get_inputs()]
    for Tq, Tk, lq, lk in CASES:
        q, k, v, ql, kl = padded_inputs(H, Tq, Tk, DK, DV, lq, lk, torch.float32)
        expected = pygpt.ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
        feeds = dict(zip(names, (t.numpy() for t in (q, k, v, ql, kl))))
        got = session.run(None, {n: feeds[n] for n in names})[0]
        assert not np.isnan(got).any(), f"Tq={Tq} Tk={Tk}: NaN"
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5, rtol=1e-5,
                                   err_msg=f"Tq={Tq} Tk={Tk} lengths {lq} {lk}")


def test_unpadded_attention_in_onnxruntime(tmp_path):
    """Without lengths the graph keeps the plain bottom-right causal mask, at any Tq, Tk."""
    session = export(Attention(True, lengths=False), tmp_path)
    names = [i.name for i in session.get_inputs()]
    for Tq, Tk in ((7, 7), (1, 40), (5, 19)):
        q, k, v = torch.randn(2, H, Tq, DK), torch.randn(2, H, Tk, DK), torch.randn(2, H, Tk, DV)
        expected = pygpt.ops.attention(q, k, v, causal=True)
        unused = np.zeros(2, dtype=np.int64)  # the lengths inputs, unused by this graph
        feeds = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "q_lengths": unused,
                 "kv_lengths": unused}
        got = session.run(None, {n: feeds[n] for n in names})[0]
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5, rtol=1e-5)


class BiasedAttention(Attention):
    """Attention with a relative-position table (a parameter) and ALiBi slopes (a buffer), as a
    model holds them."""

    def __init__(self, causal, lengths, max_distance=5):
        super().__init__(causal, lengths)
        g = torch.Generator().manual_seed(3)
        self.table = torch.nn.Parameter(torch.randn(H, 2 * max_distance + 1, generator=g))
        self.register_buffer("slopes", torch.tensor([0.5, 0.125]))

    def forward(self, q, k, v, q_lengths, kv_lengths):
        lengths = dict(q_lengths=q_lengths, kv_lengths=kv_lengths) if self.lengths else {}
        return pygpt.ops.attention(q, k, v, causal=self.causal, rel_bias=self.table,
                                   alibi_slopes=self.slopes, **lengths)


@pytest.mark.parametrize("lengths", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_position_bias_in_onnxruntime(causal, lengths, tmp_path):
    """The relative table and ALiBi slopes become in-graph math (distances, a gather from the
    table, added to the scores) that matches the kernels, padded or not, at other shapes (Tq <
    Tk: the queries are the last positions) than the graph was traced with."""
    module = BiasedAttention(causal, lengths)
    session = export(module, tmp_path)
    names = [i.name for i in session.get_inputs()]
    for Tq, Tk, lq, lk in CASES if lengths else [(7, 7, None, None), (3, 40, None, None)]:
        if lengths:
            q, k, v, ql, kl = padded_inputs(H, Tq, Tk, DK, DV, lq, lk, torch.float32)
        else:
            q, k, v = (torch.randn(2, H, n, d) for n, d in ((Tq, DK), (Tk, DK), (Tk, DV)))
            ql = kl = torch.zeros(2, dtype=torch.int64)  # unused by this graph
        with torch.no_grad():
            expected = module(q, k, v, ql, kl)
        feeds = dict(zip(["q", "k", "v", "q_lengths", "kv_lengths"],
                         (t.numpy() for t in (q, k, v, ql, kl))))
        got = session.run(None, {n: feeds[n] for n in names})[0]
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5, rtol=1e-5,
                                   err_msg=f"Tq={Tq} Tk={Tk} lengths {lq} {lk}")
