"""The BERT model (pygpt.models.bert): our kernels against the plain-PyTorch path, padding
invariance (a sentence alone and in a padded batch give the same outputs), both also with the
relative and ALiBi score biases, post- and pre-norm structure, the heads and their losses
against explicit computations, BERT's initialisation, and a tiny model memorising masked
tokens. Tiny configs, so the module runs in seconds."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers import close, spread_, twin
from pygpt.config import ModelConfig
from pygpt.config.fields import config_from_dict, to_dict
from pygpt.config.presets import preset
from pygpt.families import build
from pygpt.models import BERT
from pygpt.models.bert import IGNORE_INDEX

V = 30
POST = ModelConfig(arch="bert", vocab_size=V, block_size=24, n_layer=2, n_head=2, n_embd=32,
                   norm="post", embed_norm=True, final_norm=False, num_labels=3)
PRE = dataclasses.replace(POST, norm="pre", final_norm=True)
# Rotary positions (half of each head rotating) with a ReLU MLP; no positions at all; and the
# score-bias encodings (no position embedding): relative with distances past max_distance, ALiBi
# on pre-norm.
ROTARY = dataclasses.replace(POST, pos_encoding="rotary", rotary_dim=8, activation="relu")
NONE = dataclasses.replace(PRE, pos_encoding="none")
RELATIVE = dataclasses.replace(POST, pos_encoding="relative", max_distance=4)
ALIBI = dataclasses.replace(PRE, pos_encoding="alibi", n_head=4)
MEAN = dataclasses.replace(POST, pooling="mean")
TOKEN = dataclasses.replace(POST, pooling="token", nsp=False)  # an entity tagger's head
# The tanh GELU (blocks and masked-LM head) and a layer norm epsilon other than the default.
GELU_TANH = dataclasses.replace(POST, activation="gelu_tanh", norm_eps=1e-3)
CONFIGS = dict(post=POST, pre=PRE, rotary=ROTARY, none=NONE, relative=RELATIVE, alibi=ALIBI,
               mean_pooling=MEAN, gelu_tanh_eps=GELU_TANH)
TOL = dict(atol=1e-5, rtol=1e-5)


def make(cfg=POST, kernels="ext", seed=0):
    torch.manual_seed(seed)
    return spread_(BERT(cfg, kernels=kernels), 0.2)


def batch(seed=1, B=4, T=19):
    """input_ids with right padding (id 0) past each row's length, segment ids (A then B), and
    labels at a few masked positions."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 5, 12, 1][:B])
    ids = torch.randint(5, V, (B, T), generator=g)
    segments = torch.zeros(B, T, dtype=torch.long)
    mlm_labels = torch.full((B, T), IGNORE_INDEX)
    for b, n in enumerate(lengths.tolist()):
        ids[b, n:] = 0
        segments[b, n // 2:n] = 1
        for t in range(1, n, 3):
            mlm_labels[b, t] = ids[b, t]
    return ids, segments, lengths, mlm_labels


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_ext_matches_torch(cfg):
    ext = make(cfg)
    ref = twin(ext, "torch")
    ids, seg, lengths, mlm = batch()
    nsp, labels = torch.tensor([1, 0, 1, 0]), torch.tensor([0, 2, 1, 1])
    out_e = ext(ids, seg, lengths, mlm, nsp, labels)
    out_t = ref(ids, seg, lengths, mlm, nsp, labels)
    for name in ("loss", "mlm_logits", "nsp_logits", "logits"):
        close(getattr(out_e, name), getattr(out_t, name), TOL, name, rel_to_max=True)
    out_e.loss.backward()
    out_t.loss.backward()
    grads_t = dict(ref.named_parameters())
    for name, p in ext.named_parameters():
        close(p.grad, grads_t[name].grad, dict(atol=1e-5, rtol=1e-4), f"grad {name}",
              rel_to_max=True)


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_sentence_alone_equals_it_in_a_padded_batch(cfg, kernels):
    """Padding invariance: each row's hidden states, pooled heads and masked-LM logits equal those
    of the row run alone at its own length, whatever the padding holds."""
    model = make(cfg, kernels).eval()
    ids, seg, lengths, _ = batch()
    ids = ids.clone()
    ids[1, 5:] = 7  # padding that is not even the pad id: still never attended to
    hidden = model.encode(ids, seg, lengths)
    out = model(ids, seg, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = model.encode(ids[b:b + 1, :n], seg[b:b + 1, :n])
        close(hidden[b:b + 1, :n], alone, TOL, f"row {b} hidden", rel_to_max=True)
        alone_out = model(ids[b:b + 1, :n], seg[b:b + 1, :n])
        close(out.nsp_logits[b:b + 1], alone_out.nsp_logits, TOL, f"row {b} nsp", rel_to_max=True)
        close(out.logits[b:b + 1], alone_out.logits, TOL, f"row {b} class", rel_to_max=True)
    assert not hidden.isnan().any()


def test_heads_and_losses_written_out():
    """The loss is the sum of the three mean cross-entropies: masked-LM over the labelled
    positions only, next-sentence on the pooled [CLS], classification on the same."""
    model = make()
    ids, seg, lengths, mlm = batch()
    nsp, labels = torch.tensor([1, 0, 1, 0]), torch.tensor([0, 2, 1, 1])
    out = model(ids, seg, lengths, mlm, nsp, labels)
    h = model.encode(ids, seg, lengths)
    at = mlm != IGNORE_INDEX
    assert out.mlm_logits.shape == (int(at.sum()), V)
    close(out.mlm_logits, model.mlm(h)[at], TOL, "mlm logits at the masked positions")
    pooled = torch.tanh(model.pooler(h[:, 0]))
    expected = (F.cross_entropy(model.mlm(h)[at], mlm[at]) +
                F.cross_entropy(model.nsp(pooled), nsp) +
                F.cross_entropy(model.classifier(pooled), labels))
    close(out.loss, expected, TOL, "loss")
    # Without labels: no loss; full MLM logits only for a model without a classifier.
    plain = model(ids, seg, lengths)
    assert plain.loss is None and plain.mlm_logits is None and plain.logits.shape == (4, 3)
    no_cls = make(dataclasses.replace(POST, num_labels=0))
    assert no_cls(ids, seg, lengths).mlm_logits.shape == (4, 19, V)
    with pytest.raises(ValueError, match="classification head"):
        no_cls(ids, seg, lengths, labels=labels)


def test_mean_pooling_written_out():
    """With pooling "mean" the classifier reads the mean final hidden state over each row's real
    tokens (padding excluded), and the pooler still serves next-sentence prediction."""
    model = make(MEAN).eval()
    ids, seg, lengths, _ = batch()
    out = model(ids, seg, lengths)
    h = model.encode(ids, seg, lengths)
    means = torch.stack([h[b, :n].mean(0) for b, n in enumerate(lengths.tolist())])
    close(out.logits, model.classifier(means), TOL, "logits of the mean")
    close(out.nsp_logits, model.nsp(torch.tanh(model.pooler(h[:, 0]))), TOL, "nsp on [CLS]")
    close(model(ids[:1])[3], model.classifier(model.encode(ids[:1]).mean(1)), TOL, "no lengths")
    assert not torch.allclose(out.logits, make(POST).eval()(ids, seg, lengths).logits)
    with pytest.raises(ValueError, match="pooling"):
        ModelConfig(arch="bert", pooling="max")


def token_labels(lengths, T, seed=2):
    """(B, T) labels of 3 classes at every other real position past [CLS], IGNORE_INDEX
    elsewhere (later pieces of a word, [CLS], padding)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.full((len(lengths), T), IGNORE_INDEX)
    for b, n in enumerate(lengths.tolist()):
        labels[b, 1:n:2] = torch.randint(0, 3, (len(range(1, n, 2)),), generator=g)
    return labels


@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_token_head_written_out(kernels):
    """With pooling "token" the classifier maps each position's final hidden state to its
    logits (B, T, num_labels), and the loss is the mean cross-entropy over the labelled
    positions only, written here in plain PyTorch; a row alone gives its positions' logits as in
    the padded batch."""
    model = make(TOKEN, kernels).eval()
    ids, seg, lengths, _ = batch()
    labels = token_labels(lengths, ids.shape[1])
    out = model(ids, seg, lengths, labels=labels)
    h = model.encode(ids, seg, lengths)
    linear = model.classifier[1]
    logits = h @ linear.weight.T + linear.bias
    assert out.logits.shape == (4, 19, 3)
    close(out.logits, logits, TOL, "per-token logits")
    at = labels != IGNORE_INDEX
    picked = logits[at].log_softmax(-1).gather(1, labels[at][:, None])
    close(out.loss, -picked.mean(), TOL, "loss over the labelled positions")
    for b, n in enumerate(lengths.tolist()):
        alone = model(ids[b:b + 1, :n], seg[b:b + 1, :n]).logits
        close(out.logits[b:b + 1, :n], alone, TOL, f"row {b} alone", rel_to_max=True)
    nothing = torch.full_like(labels, IGNORE_INDEX)
    assert model(ids, seg, lengths, labels=nothing).loss is None


def test_token_head_ext_matches_torch():
    ext = make(TOKEN)
    ref = twin(ext, "torch")
    ids, seg, lengths, _ = batch()
    labels = token_labels(lengths, ids.shape[1])
    out_e, out_t = ext(ids, seg, lengths, labels=labels), ref(ids, seg, lengths, labels=labels)
    close(out_e.loss, out_t.loss, TOL, "loss")
    out_e.loss.backward()
    out_t.loss.backward()
    grads_t = dict(ref.named_parameters())
    for name, p in ext.named_parameters():
        if p.grad is not None:
            close(p.grad, grads_t[name].grad, dict(atol=1e-5, rtol=1e-4), f"grad {name}",
                  rel_to_max=True)


def test_pooling_defaults():
    """The bert presets pool by the mean; a config saved before the field existed (an older
    checkpoint's, its classifier trained on [CLS]) loads as cls, as it was trained."""
    assert preset("bert-baby").model.pooling == preset("bert-classify").model.pooling == "mean"
    saved = to_dict(POST)
    del saved["pooling"]
    assert config_from_dict(ModelConfig, saved).pooling == "cls"


def test_structure_and_initialisation():
    torch.manual_seed(0)
    post = BERT(dataclasses.replace(POST, n_layer=4, n_embd=64, vocab_size=500))
    assert post.mlm.decoder.weight is post.embed.tok.weight  # tied, with its own bias
    assert post.mlm.decoder.bias is not None and post.final_norm is None
    assert post.embed.norm is not None and post.embed.seg.weight.shape == (2, 64)
    assert all(b.norm == "post" for b in post.blocks)
    assert all(not b.attn.causal for b in post.blocks)
    for name in ("embed.tok.weight", "blocks.0.attn.qkv.weight", "blocks.3.mlp.proj.weight",
                 "pooler.weight", "embed.pos.weight"):
        std = dict(post.named_parameters())[name].std().item()
        assert std == pytest.approx(0.02, rel=0.15), name
    assert torch.all(post.pooler.bias == 0) and torch.all(post.blocks[0].attn_norm.weight == 1)
    pre = build(PRE)
    assert type(pre) is BERT and pre.final_norm is not None
    assert all(b.norm == "pre" for b in pre.blocks)
    assert build(dataclasses.replace(POST, nsp=False, num_labels=0)).nsp is None


def test_memorises_masked_tokens():
    """A tiny BERT learns to fill the masks of a fixed batch from context, through our kernels'
    padded attention and loss (the classification and NSP heads train alongside)."""
    cfg = dataclasses.replace(POST, num_labels=0, dropout=0.0)
    torch.manual_seed(0)
    model = BERT(cfg)
    ids, seg, lengths, mlm = batch()
    masked = torch.where(mlm != IGNORE_INDEX, torch.full_like(ids, 4), ids)  # 4: the mask id
    nsp = torch.tensor([1, 0, 1, 0])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(200):
        loss = model(masked, seg, lengths, mlm, nsp).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    out = model.eval()(masked, seg, lengths, mlm, nsp)
    at = mlm != IGNORE_INDEX
    assert out.loss.item() < 0.05
    assert torch.equal(out.mlm_logits.argmax(-1), mlm[at])
