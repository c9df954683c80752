"""Structured pruning's parts (pygpt.pruning): the head and unit masks leave the model's outputs
as they are at ones; the importance scores are the masks' gradients (finite differences agree)
and deterministic; a pruned model equals the original with the removed heads and units masked
to zero, for every family; keeping everything gives the original bit for bit; the config's
widths apart from n_embd stay out of every existing config."""
import dataclasses
import json
from collections import namedtuple

import pytest
import torch

from helpers import TINY, close, rand_tokens, spread_, state_dicts_equal
from pygpt.config import ModelConfig
from pygpt.config_fields import to_dict
from pygpt.families import build
from pygpt.pruning import choose, importance, masked, ones_masks, shrink

CFGS = {
    "gpt": TINY,
    "gpt-rotary-nobias": dataclasses.replace(TINY, pos_encoding="rotary", bias=False, n_head=4),
    "bert": ModelConfig(arch="bert", vocab_size=23, block_size=16, n_layer=2, n_head=4,
                        n_embd=32, norm="post", embed_norm=True, final_norm=False),
    "bert-classifier": ModelConfig(arch="bert", vocab_size=23, block_size=16, n_layer=2,
                                   n_head=4, n_embd=32, num_labels=3, pooling="mean"),
    "seq2seq": ModelConfig(arch="seq2seq", vocab_size=23, block_size=16, n_layer=2, n_head=4,
                           n_embd=32, n_dec_layer=1, qk_dim=6, v_dim=10),
}


def model_of(name, seed=0, kernels="ext"):
    torch.manual_seed(seed)
    return spread_(build(CFGS[name], kernels=kernels), 0.2).eval()


def batch_of(cfg, seed=1):
    """A forward's keyword arguments with labels, so that the output has a loss."""
    x = rand_tokens(3, 9, vocab=cfg.vocab_size, seed=seed)
    if cfg.arch == "gpt":
        return {"idx": x, "targets": rand_tokens(3, 9, vocab=cfg.vocab_size, seed=seed + 1)}
    if cfg.arch == "bert" and cfg.num_labels:
        return {"input_ids": x, "lengths": torch.tensor([9, 5, 7]),
                "labels": torch.tensor([0, 2, 1])}
    if cfg.arch == "bert":
        labels = torch.full_like(x, -100)
        labels[:, 2] = x[:, 2]
        return {"input_ids": x, "lengths": torch.tensor([9, 5, 7]), "mlm_labels": labels}
    return {"src": x, "src_lengths": torch.tensor([9, 5, 7]), "tgt_in": x[:, :6],
            "tgt_out": x[:, 1:7], "tgt_lengths": torch.tensor([6, 4, 5])}


LABELS = {"targets", "mlm_labels", "labels", "tgt_out"}


def outputs(model, batch):
    """The loss on batch, and every logits tensor of the output without the labels, as one."""
    loss = model(**batch).loss
    out = model(**{k: v for k, v in batch.items() if k not in LABELS})
    return loss, torch.cat([v.flatten() for k, v in out._asdict().items()
                            if k != "loss" and v is not None])


def as_batches(batch, n=1):
    Batch = namedtuple("Batch", batch)
    return [Batch(**batch)] * n


def random_keep(model, heads, seed=3):
    g = torch.Generator().manual_seed(seed)
    scores = {n: torch.rand(len(m), generator=g) for n, m in ones_masks(model).items()}
    return choose(model, scores, heads, model.config.mlp_width // 2)


@pytest.mark.parametrize("name", list(CFGS))
def test_a_pruned_model_equals_the_original_with_the_removed_masked_to_zero(name):
    model = model_of(name)
    batch = batch_of(model.config)
    keep = random_keep(model, heads=2)
    pruned = shrink(model, keep)
    assert pruned.config.n_head == 2 and pruned.config.mlp_width == model.config.mlp_width // 2
    assert pruned.config.qk_head_dim == model.config.qk_head_dim
    zeros = {n: torch.zeros(len(m)).index_fill(0, keep[n], 1.0)
             for n, m in ones_masks(model).items()}
    with torch.no_grad(), masked(model, zeros):
        loss, logits = outputs(model, batch)
    with torch.no_grad():
        p_loss, p_logits = outputs(pruned, batch)
    close(p_logits, logits, {"atol": 2e-5, "rtol": 1e-5}, "logits")
    close(p_loss, loss, {"atol": 2e-5, "rtol": 1e-5}, "loss")
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(CFGS))
def test_keeping_everything_is_the_original_bit_for_bit(name):
    model = model_of(name)
    full = {n: torch.arange(len(m)) for n, m in ones_masks(model).items()}
    same = shrink(model, full)
    assert same.config == model.config
    state_dicts_equal(same.state_dict(), model.state_dict())
    batch = batch_of(model.config)
    with torch.no_grad():
        assert torch.equal(outputs(same, batch)[1], outputs(model, batch)[1])
        with masked(model, ones_masks(model)):  # the masks at one change nothing either
            assert torch.equal(outputs(model, batch)[1], outputs(same, batch)[1])


@pytest.mark.parametrize("name", ["gpt", "bert-classifier", "seq2seq"])
def test_scores_are_the_mask_gradients_and_deterministic(name):
    """Each score (before the per-layer normalisation) is |dL/dxi| at xi = 1, checked against
    central finite differences of the loss in float64 on the plain-PyTorch kernels; the model's
    own kernels give the same scores, and twice the same."""
    model = model_of(name).double()
    model.kernels = "torch"
    batch = batch_of(model.config)
    masks = {n: m.double().requires_grad_() for n, m in ones_masks(model).items()}
    with masked(model, masks):
        grads = torch.autograd.grad(outputs(model, batch)[0], list(masks.values()))
    eps = 1e-6
    for (name_, mask), grad in zip(masks.items(), grads):
        for i in (0, len(mask) - 1):
            losses = []
            for sign in (1, -1):
                moved = {n: m.detach().clone() for n, m in masks.items()}
                moved[name_][i] += sign * eps
                with torch.no_grad(), masked(model, moved):
                    losses.append(model(**batch).loss.item())
            fd = (losses[0] - losses[1]) / (2 * eps)
            assert abs(fd - grad[i].item()) <= 1e-6 + 1e-5 * abs(fd), (name_, i, fd, grad[i])
    ext = model_of(name)
    scores = importance(ext, as_batches(batch))
    assert torch.equal(importance(ext, as_batches(batch))["blocks.0.attn" if name != "seq2seq"
                                                        else "encoder.0.attn"],
                       scores["blocks.0.attn" if name != "seq2seq" else "encoder.0.attn"])
    for (n, s), g in zip(scores.items(), grads):
        expected = g.abs().float()
        close(s, expected / expected.norm(), {"atol": 1e-4, "rtol": 1e-3}, n)


def test_importance_leaves_the_model_as_it_was():
    model = model_of("gpt").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    importance(model, as_batches(batch_of(model.config), 2))
    assert model.training and all(p.requires_grad and p.grad is None for p in model.parameters())
    state_dicts_equal(model.state_dict(), before)


@pytest.mark.parametrize("cfg, heads, mlp, message", [
    (CFGS["gpt"], 3, 128, "heads kept per layer must be 1 to n_head 2"),
    (CFGS["gpt"], 2, 0, "MLP units kept per layer must be 1 to 128"),
    (dataclasses.replace(TINY, pos_encoding="alibi"), 1, 128, "pos_encoding alibi"),
    (dataclasses.replace(TINY, pos_encoding="relative"), 1, 128, "pos_encoding relative"),
    (dataclasses.replace(TINY, mlp=False), 2, 64, "no MLP"),
])
def test_what_cannot_be_pruned_is_refused(cfg, heads, mlp, message):
    model = build(cfg)
    with pytest.raises(ValueError, match=message):
        choose(model, {n: torch.ones(len(m)) for n, m in ones_masks(model).items()}, heads, mlp)


def test_widths_apart_from_n_embd_are_saved_only_where_set():
    """A default config saves none of qk_dim, v_dim, mlp_dim (a translator's qk_dim and v_dim
    as before); a set one is saved, refused where out of range, and sizes the model."""
    assert not {"qk_dim", "v_dim", "mlp_dim"} & set(to_dict(TINY))
    assert {"qk_dim", "v_dim"} <= set(to_dict(CFGS["seq2seq"])) and "mlp_dim" not in to_dict(
        CFGS["seq2seq"])
    cfg = dataclasses.replace(TINY, n_head=3, qk_dim=16, v_dim=8, mlp_dim=40)
    assert json.loads(json.dumps(to_dict(cfg)))["mlp_dim"] == 40
    model = build(cfg)
    assert model.blocks[0].attn.qkv.weight.shape == (3 * 16 * 2 + 3 * 8, 32)
    assert model.blocks[0].mlp.fc.weight.shape == (40, 32)
    with pytest.raises(ValueError, match="must be divisible by n_head"):
        dataclasses.replace(TINY, n_head=3, qk_dim=16)
    with pytest.raises(ValueError, match="mlp_dim must not be negative"):
        dataclasses.replace(TINY, mlp_dim=-1)
