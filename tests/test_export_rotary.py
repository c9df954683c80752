"""The ONNX translation of pygpt.ops.rotary (plain Gather/Slice/Mul/Add/Concat math), exported on
its own with one position row and with per-batch-row positions, in both directions, run in
onnxruntime at other batch sizes, lengths and positions than it was traced with; GPTs with
rotary or no positions exported with their KV cache, whose prefill and decode steps up to the
full context match PyTorch's; and a BERT with rotary positions on padded batches."""
import dataclasses
import warnings

import numpy as np
import pytest
import torch

import pygpt.ops
from helpers import TINY, make_model, rand_tokens, spread_
from pygpt import export as exporter
from pygpt.onnx import gpt as export_gpt
from pygpt.config import ModelConfig
from pygpt.nn.rotary import rotary_tables

ort = pytest.importorskip("onnxruntime")

H, D, ROTARY_DIM, MAX_POS = 3, 10, 6, 64  # fixed in the graph; batch and T are dynamic


class Rotate(torch.nn.Module):
    def __init__(self, inverse):
        super().__init__()
        self.inverse = inverse
        cos, sin = rotary_tables(MAX_POS, ROTARY_DIM)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x, positions):
        return torch.ops.pygpt.rotary(x, self.cos, self.sin, positions, self.inverse)


def _session(module, example, dynamic, tmp_path):
    path = tmp_path / "rotary.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example, None, input_names=["x", "positions"], output_names=["y"],
            dynamic_shapes=dynamic, custom_translation_table=exporter.TRANSLATIONS,
            opset_version=exporter.OPSET, dynamo=True, external_data=False, optimize=True,
            verbose=False)
    program.save(str(path), external_data=False)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("per_row", [False, True], ids=["one_row", "per_row"])
def test_rotary_in_onnxruntime(per_row, inverse, tmp_path):
    from torch.export import Dim

    batch, t = Dim("batch", min=1, max=64), Dim("t", min=1, max=MAX_POS)
    example = (torch.randn(2, H, 5, D), torch.randint(0, MAX_POS, (2, 5) if per_row else (5,)))
    dynamic = ({0: batch, 2: t}, {0: batch, 1: t} if per_row else {0: t})
    session = _session(Rotate(inverse), example, dynamic, tmp_path)
    module = Rotate(inverse)
    for B, T in ((1, 1), (3, 7), (4, 33)):
        x = torch.randn(B, H, T, D)
        positions = torch.randint(0, MAX_POS, (B, T) if per_row else (T,))
        expected = module(x, positions)
        got = session.run(None, {"x": x.numpy(), "positions": positions.numpy()})[0]
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-6, rtol=1e-6,
                                   err_msg=f"B={B} T={T}")


CONFIGS = {
    "rotary": dataclasses.replace(TINY, pos_encoding="rotary", rotary_dim=8, activation="relu",
                                  norm="post"),
    "none": dataclasses.replace(TINY, pos_encoding="none"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpt_export_prefill_and_decode(name, tmp_path):
    model = make_model(CONFIGS[name], spread=0.3).eval()
    path = tmp_path / "model.onnx"
    export_gpt._to_onnx(model, path)
    export_gpt._check_against_torch(model, path)  # the export's own check: prefill + one step
    import onnx

    domains = {node.domain for node in onnx.load(str(path)).graph.node}
    assert domains <= {"", "ai.onnx"}, f"custom-op domains left in the graph: {domains}"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs, _ = export_gpt.io_names(model.config.n_layer)
    ids = rand_tokens(2, 5)
    past = export_gpt.empty_past(model, 2)
    with torch.no_grad():
        expected, cache = model.prefill(ids)
    while True:
        feeds = {"input_ids": ids.numpy(), "input_lengths": np.full(2, ids.shape[1]),
                 "past_lengths": np.full(2, past[0][0].shape[2])}
        feeds.update({n: t.numpy() for n, t in zip(inputs[3:], [t for kv in past for t in kv])})
        got = session.run(None, feeds)
        np.testing.assert_allclose(got[0], expected.numpy(), atol=1e-4, rtol=0,
                                   err_msg=f"at position {cache.position}")
        past = [(torch.from_numpy(got[1 + 2 * i]), torch.from_numpy(got[2 + 2 * i]))
                for i in range(model.config.n_layer)]
        if cache.position == model.config.block_size:
            break
        ids = expected[:, -1].argmax(-1, keepdim=True)
        with torch.no_grad():
            expected = model.step(ids, cache)


def test_bert_export_with_rotary(tmp_path):
    """A BERT with rotary positions exports too; the export's own check runs it in onnxruntime
    on padded batches against PyTorch."""
    from pygpt.onnx.bert import _check_against_torch, _to_onnx
    from pygpt.models import BERT

    cfg = ModelConfig(arch="bert", vocab_size=30, block_size=24, n_layer=2, n_head=2, n_embd=32,
                      norm="post", embed_norm=True, final_norm=False, pos_encoding="rotary",
                      rotary_dim=8)
    torch.manual_seed(0)
    model = spread_(BERT(cfg), 0.2).eval()
    _to_onnx(model, tmp_path / "bert.onnx")
    _check_against_torch(model, tmp_path / "bert.onnx")
