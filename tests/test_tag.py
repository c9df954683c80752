"""Entity tagging end to end: `python -m pygpt.train --task tag` on the shipped CoNLL fixture
(from scratch, from a pretrained BERT, resumed exactly) logs entity-level precision, recall and
F1 that equal a rescoring of the saved checkpoint; `python -m pygpt.tag` prints entities with
character spans that slice the text, and scores a file as pygpt_runtime.conll does; bad files
and the wrong checkpoint or flags end in one `error:` line. Tiny models, a few dozen steps."""

import contextlib
import io
import json
from pathlib import Path

import pytest

import pygpt
import pygpt.classify
import pygpt.prune
import pygpt.tag
import pygpt.train
from helpers import metrics, state_dicts_equal
from pygpt.data.common import held_out
from pygpt_runtime.conll import Sentence, read_conll
from pygpt.data.labelled import SPLIT_SEED, VAL_FRACTION
from pygpt.families import family
from pygpt.storage.checkpoint import load_labels
from pygpt.storage.run_files import CONFIG
from pygpt_runtime.conll import score
from pygpt.tasks.tagging import entity_metrics, predict_tags
from pygpt_runtime.tagging import entities
from pygpt_runtime.text import word_spans

FIXTURE = Path(__file__).parent / "fixtures" / "entities.conll"
SHAPE = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32",
         "--batch-size", "16", "--eval-iters", "2", "--threads", "1", "--quiet"]


def run(main, args):
    """main(args)'s standard output."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(args)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    out = tmp_path_factory.mktemp("tag") / "run"
    pygpt.train.main(["--task", "tag", "--data", str(FIXTURE), "--out", str(out),
                      "--vocab-size", "200", "--max-iters", "60", "--eval-interval", "30",
                      "--lr", "3e-3", "--warmup-iters", "5", *SHAPE])
    return out


def test_training_logs_entity_scores_of_the_saved_model(tagger):
    """The last evaluation's entity figures are those of the checkpoint's tags on the held-out
    sentences, rescored here; a long sentence's rows (the fixture has one past the context)
    still give one tag per word."""
    config = json.loads((tagger / CONFIG).read_text())
    assert config["model"]["pooling"] == "token" and config["train"]["task"] == "tag"
    labels = load_labels(tagger)
    assert labels == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER",
                      "I-PER"]
    model, tokenizer = pygpt.load(tagger)
    model.eval()
    _, val = held_out(read_conll(FIXTURE).sentences, VAL_FRACTION, SPLIT_SEED, FIXTURE,
                      "sentence")
    encoded = pygpt.tag.encode(val, model, tokenizer, labels, FIXTURE)
    predicted = predict_tags(model, encoded, labels)
    assert [len(p) for p in predicted] == [len(s.words) for s in val]
    last = metrics(tagger)[-1]
    for name, value in entity_metrics(score([s.tags for s in val], predicted)).items():
        assert last[f"val_{name}"] == pytest.approx(value), name
    assert last["val_f1"] > 0.5 and 0 < last["val_acc"] <= 1  # it learned something
    everything = pygpt.tag.encode(read_conll(FIXTURE).sentences, model, tokenizer, labels, "f")
    assert len(everything) > len(read_conll(FIXTURE).sentences)  # the long one took two rows


def test_tag_text_prints_entities_with_their_spans(tagger):
    text = "Yuki Tanaka works for Acme Corp in New York, said Reuters."
    model, tokenizer, labels = pygpt.tag.load_tagger(str(tagger))
    found = pygpt.tag.tag_text(model, tokenizer, labels, text)
    spans = word_spans(text)
    words = tuple(text[s:e] for s, e in spans)
    assert words[-3:] == ("said", "Reuters", ".")  # punctuation split off as its own word
    # The spans are the entities of the model's own tags for those words.
    tags = predict_tags(model, pygpt.tag.encode([Sentence(words, ("O",) * len(words), 1)],
                                                model, tokenizer, labels, "t"), labels)[0]
    assert found == [(e.type, spans[e.start][0], spans[e.end - 1][1]) for e in entities(tags)]
    assert found, "the trained tagger finds no entity at all"
    lines = run(pygpt.tag.main, ["--ckpt", str(tagger), "--text", text]).splitlines()
    assert lines == [f"{kind} [{start}, {end}): {text[start:end]}" for kind, start, end in found]


def test_word_spans_split_as_bert_pretokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    text = 'John Smith, of Acme-Corp (U.S.), said: "hi"  café_x €5 naïve\tend'
    theirs = tokenizers.pre_tokenizers.BertPreTokenizer().pre_tokenize_str(text)
    assert word_spans(text) == [span for _, span in theirs]


def test_tag_scores_a_file(tagger, tmp_path):
    model, tokenizer, labels = pygpt.tag.load_tagger(str(tagger))
    tagged = read_conll(FIXTURE)
    predicted = predict_tags(model, pygpt.tag.encode(tagged.sentences, model, tokenizer, labels,
                                                     FIXTURE), labels)
    expected = score([s.tags for s in tagged.sentences], predicted)
    out = run(pygpt.tag.main, ["--ckpt", str(tagger), "--data", str(FIXTURE)]).splitlines()
    assert out[0].split() == ["type", "precision", "recall", "f1", "support"]
    rows = {line.split()[0]: line.split()[1:] for line in out[1:]}
    assert set(rows) == {"LOC", "MISC", "ORG", "PER", "micro"}
    for kind, s in expected.items():
        assert rows[kind] == [f"{s.precision:.4f}", f"{s.recall:.4f}", f"{s.f1:.4f}",
                              str(s.support)]
    # An IOB1 file (I- beginning entities) is read as BIO and says so.
    iob1 = tmp_path / "iob1.conll"
    iob1.write_text("Olga\tI-PER\nflew\tO\nto\tO\nParis\tI-LOC\n.\tO\n", encoding="utf-8")
    out = run(pygpt.tag.main, ["--ckpt", str(tagger), "--data", str(iob1)])
    assert out.startswith("2 I- tags that began an entity were read as B-")


def test_fine_tuning_a_pretrained_bert_and_resuming(tmp_path):
    """--task tag --init-from a pretraining: its encoder, a fresh per-token head; the run
    stopped and resumed ends as the straight one."""
    pre = tmp_path / "pre"
    pygpt.train.main(["--arch", "bert", "--data", str(FIXTURE), "--out", str(pre),
                      "--vocab-size", "200", "--max-iters", "2", "--eval-interval", "2", *SHAPE])
    common = ["--task", "tag", "--init-from", str(pre), "--data", str(FIXTURE),
              "--eval-interval", "2", "--batch-size", "8", "--eval-iters", "1", "--quiet",
              "--threads", "1", "--lr-decay-iters", "4"]  # the split run's schedule too
    pygpt.train.main([*common, "--out", str(tmp_path / "straight"), "--max-iters", "4"])
    pygpt.train.main([*common, "--out", str(tmp_path / "split"), "--max-iters", "2"])
    pygpt.train.main(["--resume", "--out", str(tmp_path / "split"), "--max-iters", "4",
                      "--quiet"])
    straight, _ = pygpt.load(tmp_path / "straight")
    split, _ = pygpt.load(tmp_path / "split")
    source, _ = pygpt.load(pre)
    assert straight.config.pooling == "token" and straight.config.num_labels == 9
    assert straight.config.n_embd == source.config.n_embd
    state_dicts_equal(straight.state_dict(), split.state_dict())
    assert "val_f1_PER" in metrics(tmp_path / "straight")[-1]


def write(tmp_path, text):
    path = tmp_path / "bad.conll"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text, pattern", [
    ("Peter\tB-PER\nflew\n", r"bad.conll, line 2: 'flew' has no tag"),
    ("Peter\tS-PER\n", r"bad.conll, line 1: tag 'S-PER' is not O, B-TYPE or I-TYPE"),
    ("Peter\tO\nflew\tO\n\nto\tO\n", r"every word is tagged O"),
])
def test_bad_files_are_one_line(tmp_path, text, pattern):
    with pytest.raises(SystemExit, match="^error: .*" + pattern):
        pygpt.train.main(["--task", "tag", "--data", str(write(tmp_path, text)),
                          "--out", str(tmp_path / "out"), "--tokenizer", "char", *SHAPE])
    assert not (tmp_path / "out" / CONFIG).exists()


def test_a_file_with_tags_the_model_lacks(tagger, tmp_path):
    with pytest.raises(SystemExit, match="^error: .*line 1: tags B-DATE are not the model's"):
        pygpt.tag.main(["--ckpt", str(tagger), "--data",
                        str(write(tmp_path, "May\tB-DATE\n"))])


def test_refusals(tagger, tmp_path):
    """A tagger is not a classifier, a classifier's pooling is not a
    tagger's, a tagger distils nothing yet, and pygpt.tag needs a tagger."""
    with pytest.raises(SystemExit, match="error: .*holds an entity tagger"):
        pygpt.classify.main(["--ckpt", str(tagger), "--text", "a"])
    with pytest.raises(SystemExit, match="error: --pooling mean does not fit --task tag"):
        pygpt.train.main(["--task", "tag", "--pooling", "mean", "--data", str(FIXTURE),
                          "--out", str(tmp_path / "x"), *SHAPE])
    with pytest.raises(SystemExit, match="error: --distill-from .* not yet --task tag"):
        pygpt.train.main(["--task", "tag", "--distill-from", str(tagger), "--data",
                          str(FIXTURE), "--out", str(tmp_path / "x"), *SHAPE])
    with pytest.raises(SystemExit, match="error: give either --data"):
        pygpt.tag.main(["--ckpt", str(tagger)])
    with pytest.raises(SystemExit, match="error: --text holds no words"):
        pygpt.tag.main(["--ckpt", str(tagger), "--text", "   "])


def test_tag_refuses_a_model_that_is_not_a_tagger(trained):
    with pytest.raises(SystemExit, match="error: .* holds no entity tagger"):
        pygpt.tag.main(["--ckpt", str(trained[0]), "--text", "a"])


def test_a_pruned_tagger_recovers_as_a_tagger(tagger, tmp_path):
    """Pruning a tagger scores and recovers it on its own task (--data: another CoNLL file, its
    held-out tenth then validating), and a converted tagger, without training settings, would
    take bert-tag's."""
    out = tmp_path / "pruned"
    pygpt.prune.main(["--ckpt", str(tagger), "--out", str(out), "--heads-per-layer", "1",
                      "--recover-iters", "2", "--batches", "2", "--data", str(FIXTURE),
                      "--threads", "1", "--quiet"])
    config = json.loads((out / CONFIG).read_text())
    assert config["train"]["task"] == "tag" and config["train"]["val_data"] is None
    assert "val_f1" in metrics(out)[-1]
    model, tokenizer, labels = pygpt.tag.load_tagger(str(out))
    assert model.config.layer_heads == () and model.config.n_head == 1
    bert = family("bert")
    assert bert.head_task(model.config) == "tag"
    assert bert.preset_for(bert.head_task(model.config)) == "bert-tag"


def test_a_tagger_fine_tunes_into_a_question_answerer(tagger, tmp_path):
    """--task qa --init-from a tagger: its encoder goes on (lr 0: unchanged), its 9-label head is
    made afresh as the answerer's two logits a token (not refused for its labels)."""
    out = tmp_path / "qa"
    pygpt.train.main(["--task", "qa", "--init-from", str(tagger), "--data",
                      str(Path(__file__).parent / "fixtures" / "squad.json"), "--out", str(out),
                      "--max-iters", "1", "--lr", "0", "--batch-size", "4", "--eval-iters", "1",
                      "--quiet", "--threads", "1"])
    tuned, source = pygpt.load(out)[0], pygpt.load(tagger)[0]
    assert (tuned.config.pooling, tuned.config.num_labels) == ("span", 2)
    state_dicts_equal(tuned.blocks.state_dict(), source.blocks.state_dict())
