"""ONNX export of models whose position encoding biases the attention scores (relative, ALiBi):
the GPT (prefill, then a decode step over the KV cache, where the query's position is the last)
and the BERT (a right-padded batch) exported with their table or slopes as in-graph math, must
match PyTorch in onnxruntime, as the exporters' own checks demand (they raise otherwise)."""
import dataclasses

import pytest
import torch

from helpers import TINY, spread_
from pygpt.onnx import gpt as gpt_export
from pygpt.onnx import bert as export_bert
from pygpt.config import ModelConfig
from pygpt.models import BERT, GPT

pytest.importorskip("onnxruntime")

KINDS = [dict(pos_encoding="relative", max_distance=3), dict(pos_encoding="alibi", n_head=4)]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k["pos_encoding"])
def test_gpt_export_matches_torch(kind, tmp_path):
    torch.manual_seed(0)
    model = spread_(GPT(dataclasses.replace(TINY, **kind)), 0.2).eval()
    path = tmp_path / "model.onnx"
    gpt_export._to_onnx(model, path)
    gpt_export._check_against_torch(model, path, tol=1e-4)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k["pos_encoding"])
def test_bert_export_matches_torch(kind, tmp_path):
    torch.manual_seed(0)
    base = ModelConfig(arch="bert", vocab_size=30, block_size=24, n_layer=2, n_head=2, n_embd=32,
                       norm="post", embed_norm=True, final_norm=False)
    cfg = dataclasses.replace(base, **kind)
    model = spread_(BERT(cfg), 0.2).eval()
    path = tmp_path / "model.onnx"
    export_bert._to_onnx(model, path)
    export_bert._check_against_torch(model, path, tol=1e-4)
