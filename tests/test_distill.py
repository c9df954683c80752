"""Distillation (--distill-from): the chunked KL against the unchunked formula (forward and
gradients, float64, many shapes and chunk sizes); each family's distilled loss against the same
formula on its models' full logits (the GPT's next tokens, BERT's masked positions and its
classifier, the translator's real target positions), with a teacher of another width; alpha 0
equals plain training bit for bit over whole runs of every family (dropout on: the teacher
draws no random numbers); a distilled run resumed equals one straight; the teacher's path and
settings recorded; teachers of another tokenizer, family, task or a shorter context refused in
one line."""
import json
import re

import pytest
import torch
import torch.nn.functional as F

import pygpt
from helpers import state_dicts_equal, spread_, train_cli
from pygpt.config import ModelConfig
from pygpt.data.common import IGNORE_INDEX
from pygpt.families import family
from pygpt.models import BERT, GPT, Seq2Seq
from pygpt.nn.distill_loss import LogitRows, kl_divergence
from pygpt.training.distill import Distillation
from pygpt.config import TrainConfig
from test_classify import zebra_rows
from test_labelled_data import write
from test_seq2seq_train import _sentences, _write

SMALL = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16",
         "--eval-iters", "2", "--threads", "1", "--quiet", "--warmup-iters", "2"]
BIG = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16",
       "--eval-iters", "2", "--threads", "1", "--quiet", "--warmup-iters", "2"]


def reference_kl(s, t, temperature):
    return temperature ** 2 * F.kl_div(F.log_softmax(s / temperature, -1),
                                       F.log_softmax(t / temperature, -1),
                                       log_target=True, reduction="batchmean")


@pytest.mark.parametrize("n,c,ct,v,bias,chunk_bytes,temperature", [
    (1, 3, 5, 7, True, None, 1.0), (37, 8, 12, 50, True, 200, 2.0), (64, 16, 4, 33, False, 8 * 33, 4.0),
    (10, 5, 5, 1000, True, 8000 * 3, 0.5), (5, 4, 6, 9, False, 1, 3.0)])
def test_chunked_kl_equals_the_formula(n, c, ct, v, bias, chunk_bytes, temperature):
    g = torch.Generator().manual_seed(n * v)
    x = torch.randn(n, c, dtype=torch.float64, generator=g, requires_grad=True)
    w = (torch.randn(v, c, dtype=torch.float64, generator=g) * 2).requires_grad_()
    b = torch.randn(v, dtype=torch.float64, generator=g).requires_grad_() if bias else None
    xt, wt = torch.randn(n, ct, dtype=torch.float64, generator=g), torch.randn(v, ct, dtype=torch.float64, generator=g)
    bt = torch.randn(v, dtype=torch.float64, generator=g) if bias else None
    upstream = 1.7
    ours = kl_divergence(LogitRows(x, w, b), LogitRows(xt, wt, bt), temperature, chunk_bytes)
    (ours * upstream).backward()
    mine = [p.grad.clone() for p in (x, w, b) if p is not None]
    for p in (x, w, b):
        if p is not None:
            p.grad = None
    ref = reference_kl(F.linear(x, w, b), F.linear(xt, wt, bt), temperature)
    (ref * upstream).backward()
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    for got, p in zip(mine, [p for p in (x, w, b) if p is not None]):
        torch.testing.assert_close(got, p.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("chunk_bytes", [None, 8 * 6 * 2])
def test_chunked_kl_on_logits_and_no_rows(chunk_bytes):
    s = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    t = torch.randn(9, 6, dtype=torch.float64)
    ours = kl_divergence(LogitRows(s), LogitRows(t), 2.0, chunk_bytes)
    ours.backward()
    mine, s.grad = s.grad.clone(), None
    reference_kl(s, t, 2.0).backward()
    torch.testing.assert_close(ours, reference_kl(s, t, 2.0), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mine, s.grad, rtol=1e-9, atol=1e-12)
    empty = torch.zeros(0, 6, requires_grad=True)
    loss = kl_divergence(LogitRows(empty), LogitRows(torch.zeros(0, 6)), 2.0)
    loss.backward()
    assert loss.item() == 0.0 and empty.grad.shape == (0, 6)
    with pytest.raises(ValueError, match="6 outputs, the teacher 5"):
        kl_divergence(LogitRows(s), LogitRows(torch.zeros(9, 5)), 2.0)
    with pytest.raises(ValueError, match="temperature"):
        kl_divergence(LogitRows(s), LogitRows(t), 0.0)


def _tokens(shape, vocab, seed):
    return torch.randint(5, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _lengths_and_pad(ids, lengths, pad):
    real = torch.arange(ids.shape[1]) < lengths[:, None]
    return torch.where(real, ids, pad), real


def _gpt_case(v):
    batch = {"idx": _tokens((3, 8), v, 1), "targets": _tokens((3, 8), v, 2)}
    return batch, lambda m: m(batch["idx"]).logits.reshape(-1, v)


def _bert_case(v, classify):
    lengths = torch.tensor([10, 6, 8])
    ids, real = _lengths_and_pad(_tokens((3, 10), v, 3), lengths, 0)
    batch = {"input_ids": ids, "segment_ids": (torch.arange(10) > 3).long().expand(3, 10) * real,
             "lengths": lengths}
    if classify:
        batch["labels"] = torch.tensor([0, 2, 1])
        return batch, lambda m: m(**batch).logits
    mlm = torch.full((3, 10), IGNORE_INDEX)
    mlm[0, 1], mlm[0, 7], mlm[1, 4], mlm[2, 2], mlm[2, 5] = 7, 9, 11, 13, 6
    batch.update(mlm_labels=mlm, nsp_labels=torch.tensor([1, 0, 1]))
    return batch, lambda m: m(**batch).mlm_logits


def _translator_case(v):
    src_lengths, tgt_lengths = torch.tensor([7, 4, 5]), torch.tensor([6, 3, 5])
    src, _ = _lengths_and_pad(_tokens((3, 7), v, 4), src_lengths, 0)
    tgt_in, real = _lengths_and_pad(_tokens((3, 6), v, 5), tgt_lengths, 0)
    tgt_out = torch.where(real, _tokens((3, 6), v, 6), IGNORE_INDEX)
    batch = {"src": src, "src_lengths": src_lengths, "tgt_in": tgt_in, "tgt_out": tgt_out,
             "tgt_lengths": tgt_lengths}
    return batch, lambda m: m(**batch).logits[tgt_out != IGNORE_INDEX]


CASES = {  # (model class, config changes, the batch and the logits the loss counts)
    "gpt": (GPT, {}, lambda v: _gpt_case(v)),
    "gpt-fused-loss": (GPT, {"vocab_size": 8192}, lambda v: _gpt_case(v)),
    "bert-mlm": (BERT, {"arch": "bert", "norm": "post", "final_norm": False},
                 lambda v: _bert_case(v, False)),
    "bert-classify": (BERT, {"arch": "bert", "num_labels": 3}, lambda v: _bert_case(v, True)),
    "translator": (Seq2Seq, {"arch": "seq2seq"}, lambda v: _translator_case(v)),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("alpha", [0.3, 1.0])
def test_each_family_distils_the_logits_its_loss_counts(name, alpha):
    cls, changes, case = CASES[name]
    v = changes.get("vocab_size", 40)
    base = {"vocab_size": v, "block_size": 16, "n_head": 2, **changes}
    torch.manual_seed(0)
    student = spread_(cls(ModelConfig(n_layer=1, n_embd=16, **base)), 0.2)
    teacher = spread_(cls(ModelConfig(n_layer=2, n_embd=24, **base)), 0.2).eval()
    batch, counted = case(v)
    if name == "translator":
        batch["label_smoothing"] = 0.1  # the usual loss as the translation task sets it up
    cfg = TrainConfig(distill_temperature=1.5, distill_alpha=alpha)
    fam = family(student.config.arch)
    loss = Distillation(student, teacher, fam, cfg)(**batch).loss
    loss.backward()
    ours = {k: p.grad.clone() for k, p in student.named_parameters() if p.grad is not None}
    student.zero_grad(set_to_none=True)
    with torch.no_grad():
        t = counted(teacher)
    assert t.shape[0] > 0
    ref = alpha * reference_kl(counted(student), t, 1.5) + (1 - alpha) * student(**batch).loss
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    assert ours.keys() == {k for k, p in student.named_parameters() if p.grad is not None}
    for k, p in student.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(ours[k], p.grad, rtol=1e-4, atol=1e-6, msg=k)
    assert all(p.grad is None for p in teacher.parameters())


# --- Whole runs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(text_file, tmp_path_factory):
    d = tmp_path_factory.mktemp("distil-data")
    src = _sentences(200, seed=1)
    return {"text": text_file,
            "labelled": write(d / "train.tsv", ("label", "text"), zebra_rows(120, 1)),
            "src": _write(d / "train.src", src), "tgt": _write(d / "train.tgt", [s[::-1] for s in src])}


def _family_flags(kind, data):
    return {"gpt": ["--data", str(data["text"]), "--batch-size", "4"],
            "bert": ["--arch", "bert", "--tokenizer", "char", "--data", str(data["text"]),
                     "--batch-size", "4"],
            "classify": ["--arch", "bert", "--task", "classify", "--tokenizer", "char",
                         "--data", str(data["labelled"]), "--batch-size", "8"],
            "seq2seq": ["--arch", "seq2seq", "--tokenizer", "char", "--src-data", str(data["src"]),
                        "--tgt-data", str(data["tgt"]), "--max-tokens", "200",
                        "--bleu-sentences", "2"]}[kind]


@pytest.fixture(scope="module")
def teachers(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    for kind in ("gpt", "bert", "classify", "seq2seq"):
        assert train_cli([*_family_flags(kind, data), *BIG, "--max-iters", "3",
                          "--eval-interval", "3", "--out", str(root / kind)]) == (0, None)
    return root


def _weights(out):
    return pygpt.load(out)[0].state_dict()


@pytest.mark.parametrize("kind", ["gpt", "bert", "classify", "seq2seq"])
def test_alpha_zero_is_plain_training_bit_for_bit(kind, data, teachers, tmp_path):
    flags = [*_family_flags(kind, data), *SMALL, "--max-iters", "4", "--eval-interval", "2",
             "--dropout", "0.1"]
    assert train_cli([*flags, "--out", str(tmp_path / "plain")]) == (0, None)
    assert train_cli([*flags, "--out", str(tmp_path / "zero"), "--distill-from",
                      str(teachers / kind), "--distill-alpha", "0"]) == (0, None)
    state_dicts_equal(_weights(tmp_path / "plain"), _weights(tmp_path / "zero"))
    assert train_cli([*flags, "--out", str(tmp_path / "half"), "--distill-from",
                      str(teachers / kind)]) == (0, None)
    half = _weights(tmp_path / "half")
    assert any(not torch.equal(half[k], w) for k, w in _weights(tmp_path / "plain").items())


def test_resumed_distillation_equals_straight_and_records_the_teacher(data, teachers, tmp_path):
    flags = [*_family_flags("gpt", data), *SMALL, "--eval-interval", "2", "--dropout", "0.1",
             "--distill-from", str(teachers / "gpt"), "--distill-temperature", "3",
             "--distill-alpha", "0.7"]
    assert train_cli([*flags, "--max-iters", "4", "--out", str(tmp_path / "straight")]) == (0, None)
    assert train_cli([*flags, "--max-iters", "2", "--out", str(tmp_path / "split")]) == (0, None)
    assert train_cli(["--resume", "--max-iters", "4", "--out", str(tmp_path / "split"),
                      "--quiet"]) == (0, None)
    state_dicts_equal(_weights(tmp_path / "straight"), _weights(tmp_path / "split"))
    saved = json.loads((tmp_path / "split" / "config.json").read_text())["train"]
    assert (saved["distill_from"], saved["distill_temperature"], saved["distill_alpha"]) == (
        str(teachers / "gpt"), 3.0, 0.7)
    assert sorted(p.name for p in (tmp_path / "split").iterdir()) == sorted(
        p.name for p in (tmp_path / "straight").iterdir())  # nothing of the teacher's
    assert (tmp_path / "split" / "tokenizer.json").read_bytes() == (
        teachers / "gpt" / "tokenizer.json").read_bytes()


def test_mismatched_teachers_are_refused_in_one_line(data, teachers, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("a b c d e f g abc\n" * 200)
    assert train_cli(["--data", str(other), *SMALL, "--max-iters", "1", "--eval-interval", "1",
                      "--batch-size", "2", "--block-size", "8", "--out", str(tmp_path / "o")]) == (0, None)
    relabelled = write(tmp_path / "r.tsv", ("label", "text"),
                       [("cat" if y == "yes" else "dog", t) for y, t in zebra_rows(50, 3)])
    cases = [
        (["--arch", "bert", "--task", "classify", "--data", str(relabelled), *SMALL,
          "--distill-from", str(teachers / "classify")],
         r"has the labels \['no', 'yes'\], the student \['cat', 'dog'\]"),
        (["--init-from", str(tmp_path / "o"), "--data", str(other), "--quiet", "--distill-from",
          str(teachers / "gpt")], r"another tokenizer: \d+ tokens, the student's 9"),
        ([*_family_flags("gpt", data), *SMALL, "--distill-from", str(teachers / "bert")],
         r"is a bert, the student a gpt: distillation needs one family"),
        ([*_family_flags("bert", data), *SMALL, "--distill-from", str(teachers / "classify")],
         r"is a classifier: it distils --task classify only"),
        ([*_family_flags("classify", data), *SMALL, "--distill-from", str(teachers / "bert")],
         r"is not a classifier: --task classify distils one"),
        ([*_family_flags("gpt", data), *SMALL, "--block-size", "32", "--distill-from",
          str(teachers / "gpt")], r"has a context of 16, shorter than the student's 32"),
        ([*_family_flags("gpt", data), *SMALL, "--distill-from", str(tmp_path / "none")],
         r"no checkpoint folder"),
        ([*_family_flags("gpt", data), *SMALL, "--distill-alpha", "1.5"],
         r"distill_alpha must be in \[0, 1\]"),
        ([*_family_flags("gpt", data), *SMALL, "--distill-temperature", "0"],
         r"distill_temperature must be > 0"),
    ]
    for i, (flags, pattern) in enumerate(cases):
        out = tmp_path / f"s{i}"
        code, message = train_cli([*flags, "--max-iters", "1", "--out", str(out)])
        assert code == 1 and message is not None and "\n" not in message, (flags, message)
        assert message.startswith("error: ") and re.search(pattern, message), message
