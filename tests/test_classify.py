"""Fine-tuning a BERT to classify: labelled TSV/CSV files and their errors, the held-out split,
macro-F1, `python -m pygpt.train --task classify` (from a pretrained run or from scratch, resumed
exactly) and `python -m pygpt.classify`. Tiny models on an easy synthetic task: the label says
whether the text holds the word "zebra"."""

import contextlib
import dataclasses
import io
import json
import random

import pytest
import torch

import pygpt
import pygpt.classify
import pygpt.train
from helpers import metrics, state_dicts_equal
from pygpt.storage import checkpoint
from pygpt.config import ModelConfig, TrainConfig
from pygpt.data.labelled import Encoded, counts, macro_f1, read_labelled
from pygpt.models import BERT
from pygpt.storage.run_files import LABELS
from pygpt.tokenizer import CharTokenizer
from pygpt.training import evaluate
from pygpt.tasks import Classification
from test_finetune import folder_digest
from test_labelled_data import write

SHAPE = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32"]
RUN = ["--batch-size", "16", "--eval-iters", "2", "--quiet"]
WORDS = "the a cat dog runs sits on mat big small red blue".split()


def run(main, args):
    """main(args)'s standard output."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(args)
    return buf.getvalue()


def zebra_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(6)]
        yes = rng.random() < 0.5
        if yes:
            words.insert(rng.randrange(7), "zebra")
        rows.append(("yes" if yes else "no", " ".join(words)))
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("labelled")
    return (write(d / "train.tsv", ("label", "text"), zebra_rows(300, 1)),
            write(d / "val.tsv", ("label", "text"), zebra_rows(40, 2)))


@pytest.fixture(scope="module")
def pretrained(text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("bert") / "run"
    run(pygpt.train.main, ["--arch", "bert", "--data", str(text_file), "--out", str(out),
                           "--vocab-size", "300", "--max-iters", "2", "--eval-interval", "2",
                           *SHAPE, *RUN])
    return out


@pytest.fixture(scope="module")
def scratch(files, tmp_path_factory):
    """A classifier trained from scratch on the zebra task, validated on val.tsv."""
    out = tmp_path_factory.mktemp("cls") / "run"
    run(pygpt.train.main, ["--arch", "bert", "--task", "classify", "--data", str(files[0]),
                           "--val-data", str(files[1]), "--out", str(out), "--vocab-size", "200",
                           "--lr", "2e-3", "--warmup-iters", "10", "--max-iters", "200",
                           "--eval-interval", "100",
                           *SHAPE, *RUN])
    return out


@pytest.mark.parametrize("val, pattern", [
    (None, r"one\.tsv: every example is labelled 'x'"),
    ([("x", "a"), ("w", "b")], r"val\.tsv: labels the model does not know: 'w'")])
def test_labels_refused_by_training(tmp_path, val, pattern):
    rows = [("x", f"text {i}") for i in range(20)]
    data = write(tmp_path / "one.tsv", ("label", "text"), rows if val is None else
                 rows + [("y", "other")] * 3)
    flags = [] if val is None else ["--val-data", str(write(tmp_path / "val.tsv",
                                                           ("label", "text"), val))]
    with pytest.raises(SystemExit, match="error: .*" + pattern):
        run(pygpt.train.main, ["--arch", "bert", "--task", "classify", "--data", str(data),
                               "--out", str(tmp_path / "out"), "--tokenizer", "char",
                               "--max-iters", "1", *flags, *SHAPE, *RUN])
    assert not (tmp_path / "out").exists()


def test_pairs_train_and_classify(tmp_path):
    rows = [(lab, a, b) for lab, a, b in [("same", "cat", "cat"), ("diff", "cat", "dog"),
                                          ("same", "dog", "dog"), ("diff", "dog", "cat")] * 5]
    data = write(tmp_path / "pairs.csv", ("label", "text", "text_pair"), rows, sep=",")
    out = tmp_path / "run"
    run(pygpt.train.main, ["--arch", "bert", "--task", "classify", "--data", str(data),
                           "--out", str(out), "--tokenizer", "char", "--max-iters", "2",
                           *SHAPE, *RUN])
    lines = run(pygpt.classify.main, ["--ckpt", str(out), "--text", "cat", "--text-pair", "dog"]
                ).splitlines()
    assert lines[0] in ("diff", "same")
    assert sum(float(line.split(":")[1]) for line in lines[1:]) == pytest.approx(1, abs=1e-3)
    (out / LABELS).write_text('["only one"]')
    with pytest.raises(SystemExit, match=r"error: .*labels\.json must be a list of the "
                                         r"model's 2 label names"):
        pygpt.classify.main(["--ckpt", str(out), "--text", "cat"])


# --- training ---------------------------------------------------------------------------------

def test_from_scratch_learns_the_task_and_the_cli_agrees(scratch, files):
    records = metrics(scratch)
    assert [r["step"] for r in records] == [100, 200]
    assert records[-1]["val_acc"] >= 0.9 and records[-1]["val_f1"] >= 0.9
    assert json.loads((scratch / LABELS).read_text()) == ["no", "yes"]
    assert checkpoint.load_labels(scratch) == ["no", "yes"]
    model, _ = pygpt.load(scratch)
    assert isinstance(model, BERT) and model.config.num_labels == 2
    # The evaluation passes over the whole validation file: the CLI on it gives the same figures.
    lines = run(pygpt.classify.main, ["--ckpt", str(scratch), "--data", str(files[1])]).splitlines()
    n = len(read_labelled(files[1]))
    correct = round(records[-1]["val_acc"] * n)
    assert lines[0] == f"accuracy {correct / n:.4f} ({correct}/{n})"
    assert lines[1] == f"macro-F1 {records[-1]['val_f1']:.4f}"
    assert lines[3].startswith("confusion (rows: true label")
    header, no, yes = (line.split() for line in lines[4:7])
    assert header[-2:] == ["no", "yes"] and no[0] == "no" and yes[0] == "yes"
    table = [[int(x) for x in no[1:]], [int(x) for x in yes[1:]]]
    assert sum(map(sum, table)) == n and table[0][0] + table[1][1] == correct


def test_classify_text_prints_label_and_probabilities(scratch):
    lines = run(pygpt.classify.main, ["--ckpt", str(scratch), "--text",
                                      "the big zebra sits on a mat"]).splitlines()
    probs = {line.split(":")[0].strip(): float(line.split(":")[1]) for line in lines[1:]}
    assert lines[0] == "yes" and set(probs) == {"no", "yes"}
    assert sum(probs.values()) == pytest.approx(1, abs=1e-3) and probs["yes"] > 0.5


def test_classify_errors(scratch, pretrained, tmp_path):
    bad = write(tmp_path / "t.tsv", ("label", "text"), [("no", "a cat"), ("maybe", "a dog")])
    with pytest.raises(SystemExit, match=r"error: .*t\.tsv: labels the model does not know: "
                                         r"'maybe' \(first on line 3\)"):
        pygpt.classify.main(["--ckpt", str(scratch), "--data", str(bad)])
    with pytest.raises(SystemExit, match="error: .*without a classification head"):
        pygpt.classify.main(["--ckpt", str(pretrained), "--text", "a cat"])
    with pytest.raises(SystemExit, match="error: give either --data"):
        pygpt.classify.main(["--ckpt", str(scratch)])
    with pytest.raises(SystemExit, match="error: no labelled data file"):
        pygpt.classify.main(["--ckpt", str(scratch), "--data", str(tmp_path / "none.tsv")])


def test_fine_tuning_starts_from_the_encoder_and_leaves_the_source(pretrained, files, text_file,
                                                                    tmp_path):
    before = folder_digest(pretrained)
    out = tmp_path / "ft"
    # lr 0: the weights stay where fine-tuning started.
    run(pygpt.train.main, ["--task", "classify", "--init-from", str(pretrained), "--data",
                           str(files[0]), "--out", str(out), "--lr", "0", "--max-iters", "2",
                           "--eval-interval", "2", *RUN])
    assert folder_digest(pretrained) == before
    source, _ = pygpt.load(pretrained)
    tuned, _ = pygpt.load(out)
    assert (out / "tokenizer.json").read_bytes() == (pretrained / "tokenizer.json").read_bytes()
    src, dst = source.state_dict(), tuned.state_dict()
    assert torch.equal(src["embed.tok.weight"], dst["embed.tok.weight"])
    assert not torch.equal(src["embed.tok.weight"], BERT(tuned.config).embed.tok.weight)
    assert all(torch.equal(v, dst[k]) for k, v in src.items())  # every tensor it had
    head = dst["classifier.1.weight"]
    assert head.shape == (2, 32) and 0.01 < head.std().item() < 0.03
    assert not dst["classifier.1.bias"].any()
    # Fine-tuning a classifier again (on other labels) starts a fresh head too.
    three = write(tmp_path / "three.tsv", ("label", "text"),
                  [(lab, f"{lab} text {i}") for i in range(10) for lab in "abc"])
    run(pygpt.train.main, ["--task", "classify", "--init-from", str(out), "--data", str(three),
                           "--out", str(tmp_path / "ft3"), "--max-iters", "1", *RUN])
    assert checkpoint.load_labels(tmp_path / "ft3") == ["a", "b", "c"]
    # Pretraining a classifier further keeps its head and its labels.
    run(pygpt.train.main, ["--init-from", str(out), "--out", str(tmp_path / "more"),
                           "--data", str(text_file), "--max-iters", "1", *RUN])
    assert checkpoint.load_labels(tmp_path / "more") == ["no", "yes"]


def test_init_from_refuses_what_does_not_fit():
    cfg = ModelConfig(arch="bert", vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=16)
    with pytest.raises(ValueError, match=r"do not fit.*embed\.tok\.weight \(40, 16\) \(here "
                                         r"\(41, 16\)\)"):
        checkpoint.init_from(BERT(dataclasses.replace(cfg, vocab_size=41, num_labels=2)),
                             BERT(cfg), fresh=("classifier.",))
    with pytest.raises(ValueError, match=r"unexpected \['nsp\.bias', 'nsp\.weight'\]"):
        checkpoint.init_from(BERT(dataclasses.replace(cfg, nsp=False, num_labels=2)), BERT(cfg),
                             fresh=("classifier.",))
    with pytest.raises(ValueError, match=r"missing \['classifier\.1\.bias'"):
        checkpoint.init_from(BERT(dataclasses.replace(cfg, num_labels=2)), BERT(cfg))


def test_resume_equals_straight(files, tmp_path):
    common = ["--arch", "bert", "--task", "classify", "--tokenizer", "char", "--data",
              str(files[0]), "--dropout", "0.1", "--eval-interval", "3", *SHAPE, *RUN]
    run(pygpt.train.main, [*common, "--out", str(tmp_path / "straight"), "--max-iters", "6"])
    run(pygpt.train.main, [*common, "--out", str(tmp_path / "split"), "--max-iters", "3"])
    run(pygpt.train.main, ["--resume", "--out", str(tmp_path / "split"), "--max-iters", "6",
                           "--quiet"])
    straight, _ = pygpt.load(tmp_path / "straight")
    split, _ = pygpt.load(tmp_path / "split")
    state_dicts_equal(straight.state_dict(), split.state_dict())
    assert metrics(tmp_path / "straight") == [
        {**r, "elapsed_s": s["elapsed_s"], "tokens_per_s": s["tokens_per_s"]}
        for r, s in zip(metrics(tmp_path / "split"), metrics(tmp_path / "straight"))]


@pytest.mark.parametrize("flags, pattern", [
    (["--arch", "gpt"], "--arch must be bert"),
    (["--num-labels", "3"], "--num-labels cannot set it"),
])
def test_classify_flags_refused(files, tmp_path, flags, pattern):
    with pytest.raises(SystemExit, match=pattern):
        pygpt.train.main(["--task", "classify", "--data", str(files[0]), "--out",
                          str(tmp_path / "o"), *flags, *RUN])


def test_val_data_needs_classify_and_a_gpt_source_is_refused(trained, files, tmp_path):
    with pytest.raises(SystemExit, match="--val-data is for --task classify"):
        pygpt.train.main(["--val-data", str(files[1]), "--out", str(tmp_path / "o"), *RUN])
    with pytest.raises(SystemExit, match="fine-tunes a bert; .* holds a gpt"):
        pygpt.train.main(["--task", "classify", "--init-from", str(trained[0]), "--data",
                          str(files[0]), "--out", str(tmp_path / "o"), *RUN])


def test_task_metrics_accumulate_counts_not_batch_means(files):
    """Macro-F1 over a pass in batches of 3 equals the F1 of the whole pass's counts."""
    examples = read_labelled(files[1])
    tok = CharTokenizer.from_text("".join(e.text for e in examples), specials=True)
    enc = Encoded(examples, ["no", "yes"], tok, 32)
    task = Classification(enc, enc, ["no", "yes"])
    torch.manual_seed(3)
    model = BERT(ModelConfig(arch="bert", vocab_size=tok.vocab_size, block_size=32, n_layer=1,
                             n_head=2, n_embd=16, num_labels=2)).eval()
    result = evaluate(model, task, TrainConfig(batch_size=3, eval_iters=1))
    with torch.no_grad():
        pred = pygpt.classify.predict(model, enc).argmax(-1)
    tp, fp, fn = counts(pred, enc.labels, 2)
    assert result["val_f1"] == pytest.approx(macro_f1(tp.tolist(), fp.tolist(), fn.tolist()))
    assert result["val_acc"] == pytest.approx((pred == enc.labels).float().mean().item())


def test_a_classifier_keeps_the_sources_pooling_unless_told(text_file, files, tmp_path):
    """A pretraining saved with [CLS] pooling (as a Hugging Face import is) fine-tunes to
    classify with [CLS] pooling, so that it converts back as it came; --pooling mean changes
    it."""
    src = tmp_path / "cls-pooled"
    run(pygpt.train.main, ["--arch", "bert", "--data", str(text_file), "--out", str(src),
                           "--vocab-size", "300", "--max-iters", "1", "--pooling", "cls", *SHAPE,
                           *RUN])
    assert pygpt.load(src)[0].config.pooling == "cls"
    for flags, pooling in (([], "cls"), (["--pooling", "mean"], "mean")):
        out = tmp_path / f"ft-{pooling}"
        run(pygpt.train.main, ["--task", "classify", "--init-from", str(src), "--data",
                               str(files[0]), "--out", str(out), "--max-iters", "1", *flags, *RUN])
        assert pygpt.load(out)[0].config.pooling == pooling


def test_epochs_settle_the_steps(files, tmp_path):
    """--epochs 0.5 over the 300 rows of train.tsv (with --val-data: all of them train) at a
    batch of 16 is ceil(150 / 16) = 10 steps: said at the start, trained, saved as max_iters;
    with --max-iters as well it is refused, and a GPT's pretraining refuses it."""
    out = tmp_path / "epochs"
    args = ["--arch", "bert", "--task", "classify", "--tokenizer", "char", "--data",
            str(files[0]), "--val-data", str(files[1]), "--epochs", "0.5", "--eval-interval",
            "5", *SHAPE, *RUN]
    said = run(pygpt.train.main, [*(a for a in args if a != "--quiet"), "--out", str(out)])
    assert "0.5 epochs of 16 x 32 tokens" in said
    assert "epochs: 0.5 x 300 rows = 10 steps" in said
    assert [r["step"] for r in metrics(out)] == [5, 10]
    saved = json.loads((out / "config.json").read_text())["train"]
    assert (saved["epochs"], saved["max_iters"]) == (0.5, 10)
    with pytest.raises(SystemExit, match="give --epochs or --max-iters, not both"):
        pygpt.train.main([*args, "--out", str(tmp_path / "both"), "--max-iters", "3"])
    with pytest.raises(SystemExit, match="--epochs is for --task"):
        pygpt.train.main(["--epochs", "1", "--out", str(tmp_path / "gpt"), *RUN])


def test_a_pretrained_source_fine_tunes_with_berts_recipe(pretrained, files, tmp_path):
    """--init-from a trained BERT with no --preset takes bert-classify-pretrained: BERT's recipe
    (lr 5e-5, beta2 0.999, weight decay 0.01, 10% warmup then linear decay to 0, batch 32, 3
    epochs), said at the start and saved settled; a flag still wins, --max-iters replaces the
    epochs, and --preset bert-classify brings the from-scratch settings back."""
    out = tmp_path / "recipe"
    args = ["--task", "classify", "--init-from", str(pretrained), "--data", str(files[0]),
            "--val-data", str(files[1]), "--eval-iters", "1", "--threads", "1"]
    said = run(pygpt.train.main, [*args, "--out", str(out), "--epochs", "0.25"])
    assert f"(fine-tuning {pretrained}, preset bert-classify-pretrained)" in said
    assert ("settings: AdamW, lr 5e-05, betas (0.9, 0.999), weight decay 0.01; warmup 0.1 of "
            "the steps, then linear to 0, clipping at 1") in said
    assert "epochs: 0.25 x 300 rows = 3 steps" in said  # ceil(75 / 32)
    assert "warmup: 0.1 of 3 steps = 0 steps" in said
    saved = json.loads((out / "config.json").read_text())["train"]
    assert {k: saved[k] for k in ("lr", "beta2", "weight_decay", "schedule", "batch_size",
                                  "epochs", "max_iters", "warmup_frac", "warmup_iters")} == {
        "lr": 5e-5, "beta2": 0.999, "weight_decay": 0.01, "schedule": "linear",
        "batch_size": 32, "epochs": 0.25, "max_iters": 3, "warmup_frac": 0.1, "warmup_iters": 0}
    said = run(pygpt.train.main, [*args, "--out", str(tmp_path / "steps"), "--max-iters", "20",
                                  "--eval-interval", "20", "--batch-size", "4", "--lr", "1e-4"])
    assert "20 steps of 4 x" in said and "lr 0.0001," in said
    assert "warmup: 0.1 of 20 steps = 2 steps" in said
    said = run(pygpt.train.main, [*args, "--out", str(tmp_path / "old"), "--preset",
                                  "bert-classify", "--max-iters", "1"])
    assert "lr 0.0005, betas (0.9, 0.99), weight decay 0.01; warmup 30 steps, then cosine" in said


def test_a_warmup_fraction_settles_once(files, tmp_path):
    """--warmup-frac 0.25 of a 12-step run is 3 warmup steps, saved; resumed to 24 steps the run
    keeps its 3 (its schedule does not shift under it); with --warmup-iters too it is refused."""
    out = tmp_path / "frac"
    args = ["--arch", "bert", "--task", "classify", "--tokenizer", "char", "--data",
            str(files[0]), "--out", str(out), "--eval-interval", "12", *SHAPE, *RUN]
    run(pygpt.train.main, [*args, "--max-iters", "12", "--warmup-frac", "0.25"])
    saved = json.loads((out / "config.json").read_text())["train"]
    assert (saved["warmup_frac"], saved["warmup_iters"]) == (0.25, 3)
    run(pygpt.train.main, [*args, "--resume", "--max-iters", "24"])
    saved = json.loads((out / "config.json").read_text())["train"]
    assert (saved["warmup_frac"], saved["warmup_iters"], saved["max_iters"]) == (None, 3, 24)
    with pytest.raises(SystemExit, match="give --warmup-frac or --warmup-iters, not both"):
        pygpt.train.main([*args, "--warmup-frac", "0.1", "--warmup-iters", "3"])
