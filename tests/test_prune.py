"""Structured pruning's parts (pygpt.pruning): the head and unit masks leave the model's outputs
as they are at ones; the importance scores are the masks' gradients (finite differences agree)
and deterministic; a pruned model equals the original with the removed heads and units masked
to zero, for every family, also where its layers keep different numbers (layer_heads,
layer_mlp_dims), whose KV-cache decoding equals the full recompute; the global ranking removes
the lowest scores of all layers; keeping everything gives the original bit for bit; the
config's widths apart from n_embd and per-layer sizes stay out of every existing config, and
bad per-layer sizes are refused in one line."""
import dataclasses
import json
from collections import namedtuple

import pytest
import torch

from helpers import TINY, close, rand_tokens, spread_, state_dicts_equal
from pygpt.config.fields import config_from_dict
from pygpt.config import ModelConfig
from pygpt.config.fields import to_dict
from pygpt.families import build
from pygpt.decoding.sampling import Sampling
from pygpt.pruning import (choose, choose_globally, importance, masked, ones_masks,
                           ranked_globally, shrink)

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


def layered_keep(model, seed=5):
    """Keep sets of a different size in each layer: a random count (1 to all) of random heads
    and units, so layers differ."""
    g = torch.Generator().manual_seed(seed)
    keep = {}
    for i, (n, m) in enumerate(ones_masks(model).items()):
        count = (i * 7 + 1) % len(m) + 1 if len(m) > 8 else i % len(m) + 1
        keep[n] = torch.randperm(len(m), generator=g)[:count].sort().values
    return keep


LAYERED = ["gpt", "gpt-rotary-nobias", "bert", "bert-classifier"]


@pytest.mark.parametrize("name", LAYERED)
def test_layers_keeping_different_numbers_equal_the_original_masked(name):
    """A model whose layers hold different head counts and MLP widths (the config says them in
    layer_heads and layer_mlp_dims) computes the original model with the other heads and units
    masked to zero, on our kernels and on plain PyTorch's, forward and backward."""
    model = model_of(name)
    batch = batch_of(model.config)
    keep = layered_keep(model)
    pruned = shrink(model, keep)
    cfg = pruned.config
    heads = [len(keep[f"blocks.{i}.attn"]) for i in range(cfg.n_layer)]
    units = [len(keep[f"blocks.{i}.mlp"]) for i in range(cfg.n_layer)]
    assert len(set(heads)) > 1 and len(set(units)) > 1
    assert list(cfg.layer_heads) == heads and list(cfg.layer_mlp_dims) == units
    assert [cfg.heads(i) for i in range(cfg.n_layer)] == heads and cfg.n_head == max(heads)
    assert [b.mlp.fc.out_features for b in pruned.blocks] == units
    assert [b.attn.n_head for b in pruned.blocks] == heads
    zeros = {n: torch.zeros(len(m)).index_fill(0, keep[n], 1.0)
             for n, m in ones_masks(model).items()}
    with torch.no_grad(), masked(model, zeros):
        loss, logits = outputs(model, batch)
    tol = {"atol": 2e-5, "rtol": 1e-5}
    for kernels in ("ext", "torch"):
        pruned.kernels = kernels
        with torch.no_grad():
            p_loss, p_logits = outputs(pruned, batch)
        close(p_logits, logits, tol, f"{kernels} logits")
        close(p_loss, loss, tol, f"{kernels} loss")
    grads = {}
    for kernels in ("ext", "torch"):
        pruned.kernels = kernels
        pruned.zero_grad()
        pruned(**batch).loss.backward()
        grads[kernels] = {n: p.grad.clone() for n, p in pruned.named_parameters()
                          if p.grad is not None}
    for n, g in grads["torch"].items():
        close(grads["ext"][n], g, {"atol": 1e-4, "rtol": 1e-4}, n)
    # The masked original's gradient of a kept head's query rows is the pruned model's.
    model.zero_grad()
    with masked(model, zeros):
        model(**batch).loss.backward()
    qk = model.config.qk_head_dim
    rows = (keep["blocks.1.attn"][:, None] * qk + torch.arange(qk)).flatten()
    close(pruned.blocks[1].attn.qkv.weight.grad[:len(rows)],
          model.blocks[1].attn.qkv.weight.grad[rows], {"atol": 1e-4, "rtol": 1e-4}, "W_Q grad")


def test_a_layered_gpt_decodes_with_its_cache_as_the_full_recompute():
    """Prefill then steps on the KV cache (each layer with its own heads) give the logits of
    the whole sequence at once; rows of different lengths decoded as one batch give the tokens
    each gets alone (past the context, the cache rolling), and within the context those of
    decoding without a cache."""
    model = model_of("gpt-rotary-nobias")
    pruned = shrink(model, layered_keep(model))
    assert pruned.config.layer_heads
    x = rand_tokens(2, 12, vocab=pruned.config.vocab_size, seed=4)
    with torch.no_grad():
        full = pruned(x).logits
        logits, cache = pruned.prefill(x[:, :5])
        steps = [logits] + [pruned.step(x[:, i:i + 1], cache) for i in range(5, 12)]
    assert [cache[i].k.shape[1] for i in range(len(cache))] == list(pruned.config.layer_heads)
    close(torch.cat(steps, 1), full, {"atol": 2e-5, "rtol": 1e-5}, "cached logits")
    greedy = Sampling(greedy=True)
    prompts = [rand_tokens(1, n, vocab=pruned.config.vocab_size, seed=20 + n)[0]
               for n in (1, 4, 9)]
    n = pruned.config.block_size + 5
    batched = pruned.generate_batch(prompts, n, sampling=greedy)
    for got, prompt in zip(batched, prompts):
        assert torch.equal(got, pruned.generate(prompt[None], n, sampling=greedy)[0])
    within = pruned.generate_batch(prompts, 6, sampling=greedy)  # inside the context
    for got, prompt in zip(within, prompts):
        assert torch.equal(got, pruned.generate(prompt[None], 6, sampling=greedy,
                                                use_cache=False)[0])


def test_the_global_ranking_removes_the_lowest_scores_of_all_layers():
    """Planted scores: the lowest 4 of all 12 heads sit 3 in layer 0 and 1 in layer 2, so a
    head fraction of 1/3 keeps 1, 4, 3 heads; a layer whose every score is lowest keeps its
    best one; ties go the later layer's, then the higher index, first."""
    cfg = dataclasses.replace(TINY, n_layer=3, n_head=4)
    model = build(cfg)
    scores = {n: torch.ones(len(m)) for n, m in ones_masks(model).items()}
    scores["blocks.0.attn"] = torch.tensor([0.1, 0.9, 0.2, 0.3])
    scores["blocks.1.attn"] = torch.tensor([0.5, 0.6, 0.7, 0.8])
    scores["blocks.2.attn"] = torch.tensor([0.4, 0.95, 0.05, 0.99])
    keep = choose_globally(model, scores, 4 / 12, 0.0)
    assert {n: keep[n].tolist() for n in scores if n.endswith("attn")} == {
        "blocks.0.attn": [1], "blocks.1.attn": [0, 1, 2, 3], "blocks.2.attn": [0, 1, 3]}
    assert all(torch.equal(keep[f"blocks.{i}.mlp"], torch.arange(128)) for i in range(3))
    pruned = shrink(model, keep)
    assert pruned.config.layer_heads == (1, 4, 3) and pruned.config.n_head == 4
    # At least one per layer: layer 0 holds the 4 lowest scores, but keeps its best.
    low = {"a": torch.tensor([0.01, 0.02, 0.03, 0.04]), "b": torch.tensor([0.5, 0.6, 0.7, 0.8])}
    assert {n: k.tolist() for n, k in ranked_globally(low, 4).items()} == {
        "a": [3], "b": [1, 2, 3]}
    ties = {"a": torch.ones(3), "b": torch.ones(3)}
    assert {n: k.tolist() for n, k in ranked_globally(ties, 3).items()} == {
        "a": [0, 1], "b": [0]}
    # MLP units rank the same way, apart from the heads.
    scores["blocks.1.mlp"] = torch.linspace(0.0, 0.5, 128)
    keep = choose_globally(model, scores, 0.0, 100 / 384)
    assert [len(keep[f"blocks.{i}.mlp"]) for i in range(3)] == [128, 28, 128]
    assert torch.equal(keep["blocks.1.mlp"], torch.arange(100, 128))
    assert all(len(keep[f"blocks.{i}.attn"]) == 4 for i in range(3))


def test_global_pruning_of_nothing_is_the_original_bit_for_bit():
    model = model_of("bert")
    scores = importance(model, as_batches(batch_of(model.config)))
    same = shrink(model, choose_globally(model, scores, 0.0, 0.0))
    assert same.config == model.config
    state_dicts_equal(same.state_dict(), model.state_dict())


def test_per_layer_sizes_are_saved_only_where_set_and_read_back():
    assert not {"layer_heads", "layer_mlp_dims"} & set(to_dict(TINY))
    assert not {"layer_heads", "layer_mlp_dims"} & set(to_dict(CFGS["seq2seq"]))
    cfg = dataclasses.replace(TINY, n_head=4, qk_dim=8, v_dim=8, layer_heads=(3, 1),
                              layer_mlp_dims=(7, 50))
    saved = json.loads(json.dumps(to_dict(cfg)))
    assert saved["layer_heads"] == [3, 1] and saved["layer_mlp_dims"] == [7, 50]
    assert config_from_dict(ModelConfig, saved) == cfg
    # numbers (what MAX_NUMBERS bounds) counts each layer's own matrices: the model's weight
    # matrices and position table, and the (here tied) head once more.
    matrices = sum(p.numel() for p in build(cfg).parameters() if p.dim() == 2)
    assert cfg.numbers == matrices + cfg.vocab_size * cfg.n_embd


@pytest.mark.parametrize("changes, message", [
    ({"layer_heads": (1,)}, r"layer_heads must hold one size per layer \(n_layer 2\), got 1"),
    ({"layer_heads": (1, 3)}, r"layer_heads must hold sizes of 1 to 2, got \[1, 3\]"),
    ({"layer_heads": (0, 1)}, "sizes of 1 to 2"),
    ({"layer_heads": ("1", 2)}, "layer_heads must be a list of whole numbers"),
    ({"layer_heads": [1, 2]}, "layer_heads must be a list of whole numbers"),
    ({"layer_mlp_dims": (4, 5, 6)}, "layer_mlp_dims must hold one size per layer"),
    ({"layer_mlp_dims": (4, -5)}, "layer_mlp_dims must hold sizes of 1 to"),
    ({"layer_mlp_dims": (4, 5), "mlp": False}, "layer_mlp_dims needs an MLP"),
    ({"layer_heads": (1, 2), "pos_encoding": "relative"}, "shared by every layer's heads"),
    ({"layer_heads": (1, 2), "attn_proj": False}, "layer_heads needs attn_proj"),
    ({"layer_heads": (1, 2), "arch": "seq2seq"}, "applies to arch gpt and bert only"),
    ({"layer_mlp_dims": (1 << 21, 5)}, "sizes of 1 to 1,048,576"),
])
def test_bad_per_layer_sizes_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as e:
        dataclasses.replace(TINY, **changes)
    assert "\n" not in str(e.value)


def test_a_config_json_of_huge_per_layer_sizes_is_refused_before_allocating():
    saved = {**to_dict(TINY), "n_layer": 2, "layer_mlp_dims": [1 << 20, 1 << 20],
             "n_embd": 1 << 12, "n_head": 1}
    with pytest.raises(ValueError, match="the model would hold about"):
        config_from_dict(ModelConfig, saved)
