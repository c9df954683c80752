"""pygpt.nn.position_bias: ALiBi's slopes (the paper's geometric sequence, non-power-of-two head
counts included), the PositionBias module a model owns (a learned zero-initialised table, or
fixed slopes that are not saved), and the models built with pos_encoding "relative" / "alibi"
(no position embedding, the bias reaching every layer). The models' numerics against the
plain-PyTorch path and through a KV cache are in test_gpt / test_decoding / test_bert, which run
these encodings among their architectures."""

import dataclasses

import pytest
import torch

from helpers import TINY, make_model, rand_tokens
from pygpt.config import ModelConfig
from pygpt.nn import Embeddings, MultiHeadAttention, PositionBias, alibi_slopes


@pytest.mark.parametrize("n_head, expected", [
    (1, [2 ** -8]),
    (4, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]),
    (8, [2 ** -k for k in range(1, 9)]),
    # Not a power of two: the 4-head slopes, then every other slope of 8 heads.
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
    (12, [2 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
])
def test_alibi_slopes(n_head, expected):
    torch.testing.assert_close(alibi_slopes(n_head), torch.tensor(expected), rtol=1e-7, atol=0)


def test_alibi_slopes_rejects_no_heads():
    with pytest.raises(ValueError, match="n_head"):
        alibi_slopes(0)


def test_position_bias_module():
    rel = PositionBias("relative", n_head=3, max_distance=4)
    assert rel.table.shape == (3, 9) and torch.all(rel.table == 0) and rel.table.requires_grad
    assert rel().rel_bias is rel.table and rel().alibi_slopes is None
    assert list(rel.state_dict()) == ["table"]
    alibi = PositionBias("alibi", n_head=5)
    torch.testing.assert_close(alibi().alibi_slopes, alibi_slopes(5))
    assert alibi().rel_bias is None and list(alibi.parameters()) == []
    assert list(alibi.state_dict()) == []  # fixed: rebuilt from n_head, never saved
    assert alibi.double()().alibi_slopes.dtype == torch.float64  # follows the model's dtype
    with pytest.raises(ValueError, match="score bias"):
        PositionBias("rotary", 2)
    with pytest.raises(ValueError, match="max_distance"):
        PositionBias("relative", 2, max_distance=-1)


@pytest.mark.parametrize("kind", ["relative", "alibi"])
def test_score_bias_models_have_no_position_embedding(kind):
    assert Embeddings(10, 8, 16, position=kind).pos is None
    model = make_model(dataclasses.replace(TINY, pos_encoding=kind))
    names = [name for name, _ in model.named_parameters()]
    assert not any(name.startswith("embed.pos") for name in names)
    assert ("pos_bias.table" in names) == (kind == "relative")


@pytest.mark.parametrize("kind", ["relative", "alibi"])
def test_every_layer_gets_the_bias(kind, monkeypatch):
    """Each attention layer's kernel call receives the model's one table / slopes."""
    model = make_model(dataclasses.replace(TINY, pos_encoding=kind))
    seen = []
    for layer in model.modules():
        if isinstance(layer, MultiHeadAttention):
            kern = layer.kern

            def spy(*args, _kern=kern, **kwargs):
                seen.append(kwargs["rel_bias"] if kind == "relative" else kwargs["alibi_slopes"])
                return _kern.attention(*args, **kwargs)

            monkeypatch.setattr(layer, "kern", dataclasses.replace(kern, attention=spy))
    model(rand_tokens(2, 8))
    expected = model.pos_bias.table if kind == "relative" else model.pos_bias.slopes
    assert len(seen) == TINY.n_layer and all(t is expected for t in seen)


def test_config_checks():
    with pytest.raises(ValueError, match="max_distance"):
        ModelConfig(pos_encoding="relative", max_distance=-3)
    with pytest.raises(ValueError, match="pos_encoding"):
        ModelConfig(pos_encoding="relativ")


def test_relative_bias_learns():
    """A training step moves the table (it gets a gradient through the kernels)."""
    model = make_model(dataclasses.replace(TINY, pos_encoding="relative", max_distance=3))
    x, y = rand_tokens(4, 16), rand_tokens(4, 16, seed=3)
    model(x, y).loss.backward()
    grad = model.pos_bias.table.grad
    assert grad is not None and grad.abs().sum() > 0 and torch.isfinite(grad).all()
