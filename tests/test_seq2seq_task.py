"""The translator's training task (pygpt.tasks.seq2seq.Translation): batches drawn
as a function of the generator's state within the token budget, the validation pass over every
pair, the metrics against a direct computation, and one optimizer step of the seq2seq model on
its batches through the loop's train_step; validation BLEU against greedy decoding, sentence by
sentence, scored by pygpt.tasks.bleu."""
import math

import pytest
import torch
import torch.nn.functional as F

from pygpt.tasks.bleu import score
from pygpt.config import ModelConfig
from pygpt.families import build, family
from pygpt.data.parallel import ParallelCorpus
from pygpt.tokenizer import SEQ2SEQ_SPECIALS, CharTokenizer
from pygpt.training.step import train_step
from pygpt.tasks.seq2seq import Translation
from pygpt.decoding.beam_search import Search, translate

WORDS = ["ab", "abc", "b", "cab", "ccba", "bacab", "a"]


@pytest.fixture(scope="module")
def setup():
    tok = CharTokenizer.from_text("abc ", specials=SEQ2SEQ_SPECIALS)

    def corpus(n, shift):
        pairs = [(" ".join(WORDS[(k + j) % 7] for j in range(k % 4 + 1)),
                  " ".join(WORDS[(k + j + shift) % 7] for j in range(k % 3 + 1)))
                 for k in range(n)]
        return ParallelCorpus.from_pairs(pairs, tok.encode, tok.special_tokens, max_len=23)

    return tok, Translation(corpus(60, 1), corpus(13, 2), max_tokens=120, label_smoothing=0.1)


def test_batches_are_a_function_of_the_generator_and_fit_the_budget(setup):
    _, task = setup

    def draws(seed):
        g = torch.Generator().manual_seed(seed)
        return [task.batch("train", 0, g) for _ in range(5)]

    for a, b in zip(draws(4), draws(4)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert any(not torch.equal(a.src, b.src) for a, b in zip(draws(4), draws(5)))
    assert all(b.src.numel() + b.tgt_in.numel() <= 120 for b in draws(6))


def test_the_validation_pass_covers_every_pair_once(setup):
    _, task = setup
    batches = list(task.eval_batches("val", 0, torch.Generator(), iters=3))
    assert sum(len(b.src) for b in batches) == 13
    assert sum(task.tokens(b) for b in batches) == sum(
        int(b.src_lengths.sum() + b.tgt_lengths.sum()) for b in batches)
    assert len(list(task.eval_batches("train", 0, torch.Generator(), iters=3))) == 3


def test_metrics_and_a_training_step(setup):
    tok, task = setup
    cfg = ModelConfig(arch="seq2seq", vocab_size=tok.vocab_size, block_size=24, n_layer=1,
                      n_head=2, n_embd=16, pos_encoding="sinusoidal")
    torch.manual_seed(0)
    model = family("seq2seq").build(cfg)
    batch = task.batch("train", 0, torch.Generator().manual_seed(0))
    assert task.inputs(batch) == {**batch._asdict(), "label_smoothing": 0.1}
    with torch.no_grad():
        out = model(**task.inputs(batch))
    m = task.metrics(out, batch)
    real = batch.tgt_out != -100
    n = int(real.sum())
    assert n == int(batch.tgt_lengths.sum())
    nll = F.cross_entropy(out.logits[real], batch.tgt_out[real]).item()
    assert m["nll"][1] == n and math.isclose(m["nll"][0] / n, nll, rel_tol=1e-5)
    smoothed = F.cross_entropy(out.logits[real], batch.tgt_out[real], label_smoothing=0.1)
    assert m["loss"][1] == n and math.isclose(m["loss"][0] / n, smoothed.item(), rel_tol=1e-5)
    summary = task.summarise({k: v / c for k, (v, c) in m.items()})
    assert math.isclose(summary["ppl"], math.exp(nll), rel_tol=1e-5)
    record = {f"{split}_{k}": v for split in ("train", "val") for k, v in summary.items()}
    assert task.describe(record).startswith(f"train loss {summary['loss']:.4f}")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = train_step(model, opt, [batch], 1e-2, 1.0, inputs=task.inputs)
    for _ in range(5):
        last = train_step(model, opt, [batch], 1e-2, 1.0, inputs=task.inputs)
    assert last < first


def test_an_empty_split_is_refused(setup):
    tok, task = setup
    empty = ParallelCorpus.from_pairs([("", "a")], tok.encode, tok.special_tokens, max_len=5)
    with pytest.raises(ValueError, match="the val split holds no sentence pairs"):
        Translation(task.splits["train"], empty, 100)


def test_validation_bleu_translates_a_fixed_subset_greedily(setup):
    tok, task = setup
    train, val = task.splits["train"], task.splits["val"]
    bleu_task = Translation(train, val, 120, tokenizer=tok, bleu_sentences=5, samples=2)
    assert task.model_metrics(None) == {}  # no subset asked for: nothing to do
    cfg = ModelConfig(arch="seq2seq", vocab_size=tok.vocab_size, block_size=24, n_layer=1,
                      n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = build(cfg)
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.5)
    model.train()
    got = bleu_task.model_metrics(model)
    assert model.training  # restored
    sp = tok.special_tokens
    hyps, refs = [], []
    for i in range(5):
        out = translate(model, torch.tensor(val.src.line(i))[None].long(), None, bos=sp["[BOS]"],
                        eos=sp["[EOS]"], search=Search(beam=1), banned=(sp["[PAD]"], sp["[BOS]"]))
        hyps.append(tok.decode(out[0]))
        refs.append(tok.decode(val.tgt.line(i).tolist()))
    expected = score(hyps, refs)
    assert (got["val_bleu"], got["val_bleu_lc"], got["val_chrf"]) == tuple(expected)
    assert got["val_samples"] == [{"source": tok.decode(val.src.line(i).tolist()),
                                   "reference": refs[i], "translation": hyps[i]} for i in range(2)]
    record = {f"{split}_{k}": 1.0 for split in ("train", "val")
              for k in ("loss", "nll", "ppl", "acc")}
    assert bleu_task.describe({**record, **got}).endswith(f", BLEU {expected.bleu:.2f})")
    with pytest.raises(ValueError, match="needs the tokenizer"):
        Translation(train, val, 120, bleu_sentences=5)
    with pytest.raises(ValueError, match="must not be negative"):
        Translation(train, val, 120, tokenizer=tok, bleu_sentences=-1)
