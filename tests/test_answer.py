"""Extractive question answering: SQuAD files read and checked (bad ones end in one line naming
the file and the question), questions as [CLS] question [SEP] context-window [SEP] rows with a
document stride and answers mapped to character spans, the span head's loss against plain
PyTorch, SQuAD's exact match and F1 against hand-computed values, the best span over windows,
and `python -m pygpt.train --task qa` then `python -m pygpt.answer` end to end on the shipped
fixture (tiny model, a few dozen steps), with the refusals of the wrong checkpoint or flags."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import pygpt
import pygpt.answer
import pygpt.classify
import pygpt.train
from helpers import metrics
from pygpt.config import ModelConfig
from pygpt.data.common import held_out
from pygpt.data.labelled import SPLIT_SEED, VAL_FRACTION
from pygpt.data.squad import EncodedQA
from pygpt.models import BERT
from pygpt.storage.checkpoint import load_labels
from pygpt.tasks.qa import SPAN_LABELS, best_answer, predict_answers
from pygpt.tokenizer import WordPieceTokenizer
from pygpt_runtime.answering import question_rows
from pygpt_runtime.squad import (Question, answers_scored, f1, normalize_answer, question_scores,
                                 questions_of, read_squad, squad_scores)

from test_classify import run
from test_tag import SHAPE

FIXTURE = Path(__file__).parent / "fixtures" / "squad.json"


def tokenizer():
    text = FIXTURE.read_text()
    return WordPieceTokenizer.train(text, 300)


def test_the_fixture_reads_with_its_unanswerable_questions():
    questions = questions_of(read_squad(FIXTURE))
    assert [q.id for q in questions] == ["r1", "r2", "r3", "h1", "h2", "m1", "m2", "m3", "e1",
                                         "e2"]
    assert [q.id for q in questions if not q.answers] == ["r3", "m3"]
    for q in questions:
        for a in q.answers:
            assert q.context[a.start:a.start + len(a.text)] == a.text


def squad_file(tmp_path, qa=None, context="The Rhine rises in the Alps.", **paragraph):
    """A one-question SQuAD file: qa's fields over a good question's."""
    good = {"id": "q1", "question": "Where does it rise?",
            "answers": [{"text": "the Alps", "answer_start": 19}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": context, "qas": [{**good, **(qa or {})}], **paragraph}]}]}))
    return path


@pytest.mark.parametrize("qa, context, message", [
    ({"answers": [{"text": "the Alps", "answer_start": 18}]}, None,
     "question 'q1': answer 'the Alps' is not at answer_start 18 (the context there reads "
     "' the Alp')"),
    (None, "   ", "article 0, paragraph 0: empty context (questions 'q1')"),
    ({"question": " "}, None, "question 'q1': empty question"),
    ({"answers": []}, None, "question 'q1': no answers (and not is_impossible)"),
    ({"is_impossible": True}, None, "question 'q1': is_impossible, yet it has answers"),
    ({"is_impossible": "yes"}, None, "question 'q1': 'is_impossible' must be true or false"),
    ({"answers": [{"text": "the Alps", "answer_start": "19"}]}, None,
     "question 'q1': 'answer_start' must be a int, got str"),
    ({"answers": [{"answer_start": 19}]}, None, "question 'q1': no 'text'"),
    ({"id": 7}, None, "article 0, paragraph 0, question 0: 'id' must be a str, got int"),
])
def test_bad_squad_files_are_one_line_naming_the_question(tmp_path, qa, context, message):
    path = squad_file(tmp_path, qa, **({"context": context} if context else {}))
    with pytest.raises(ValueError) as e:
        read_squad(path)
    assert str(e.value) == f"{path}, {message}"


def test_files_that_are_no_squad_are_refused(tmp_path):
    path = tmp_path / "x.json"
    for text, message in (("[1]", "SQuAD JSON is an object with a 'data' list"),
                          ('{"data": [{"paragraphs": []}]}', "no questions"),
                          ('{"data": 1}', "'data' must be a list, got int")):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"^{path}: {message}"):
            read_squad(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=f"^{path} is not SQuAD JSON"):
        read_squad(path)


def test_windows_overlap_by_the_stride_and_point_at_cls_without_the_whole_answer():
    pieces = list(range(100, 120))  # 20 context pieces; question 3 pieces; rows of 14: room 8
    answer = (9, 11)
    rows = question_rows([7, 8, 9], pieces, answer, cls=1, sep=2, most=14, stride=3)
    assert [r.first for r in rows] == [0, 5, 10, 15]  # each 8 pieces, 3 shared with the next
    for row in rows:
        context = pieces[row.first:row.first + len(row.firsts)]
        assert row.ids == [1, 7, 8, 9, 2, *context, 2] and len(row.ids) <= 14
        assert [row.ids[at] for at in row.firsts] == context
        if row.first <= answer[0] and answer[1] < row.first + len(row.firsts):
            assert (row.ids[row.start], row.ids[row.end]) == (109, 111)
        else:
            assert (row.start, row.end) == (0, 0)
    assert [(r.start, r.end) for r in rows] == [(0, 0), (9, 11), (0, 0), (0, 0)]
    assert rows[-1].first + len(rows[-1].firsts) == len(pieces)
    unanswerable = question_rows([7], pieces[:3], None, 1, 2, 14)
    assert len(unanswerable) == 1 and (unanswerable[0].start, unanswerable[0].end) == (0, 0)
    with pytest.raises(ValueError, match="the question's 11 pieces leave no room for the "
                                         r"context in a row of 14 \(a question may have 10"):
        question_rows(list(range(11)), pieces, None, 1, 2, 14)


def test_every_answer_maps_back_to_its_characters_in_some_window():
    """With rows of 24 the fixture's contexts take several windows; each answerable question
    has a row whose start and end pieces give exactly its answer's characters."""
    encoded = EncodedQA(questions_of(read_squad(FIXTURE)), tokenizer(), 24, FIXTURE, stride=4)
    assert len(encoded) > 2 * len(encoded.questions)
    for n, q in enumerate(encoded.questions):
        rows = [row for row, of in zip(encoded.rows, encoded.question_of) if of == n]
        marked = [row for row in rows if row.start]
        assert bool(marked) == bool(q.answers), q.id
        pieces = encoded.pieces[n]
        for row in marked:
            first = row.first + row.firsts.index(row.start)
            last = row.first + row.firsts.index(row.end)
            assert q.context[pieces.spans[first][0]:pieces.spans[last][1]] == q.answers[0].text
    batch = encoded.batch(range(3))
    assert batch.labels.shape == (3, 2)
    first = encoded.rows[0]
    assert batch.segment_ids[0, :first.firsts[0]].sum() == 0
    assert batch.segment_ids[0, first.firsts[0]:len(first.ids)].eq(1).all()


def test_a_question_too_long_for_the_window_is_one_line(tmp_path):
    path = squad_file(tmp_path, {"question": "where " * 30})
    with pytest.raises(ValueError, match=f"^{path}, question 'q1': the question's 120 pieces "
                                         "leave no room"):
        EncodedQA(questions_of(read_squad(path)), tokenizer(), 32, path)


@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_span_loss_is_the_mean_of_start_and_end_cross_entropies_over_real_tokens(kernels):
    cfg = ModelConfig(arch="bert", vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16,
                      norm="post", embed_norm=True, final_norm=False, pooling="span",
                      num_labels=2)
    torch.manual_seed(0)
    model = BERT(cfg, kernels=kernels).eval()
    ids = torch.randint(5, 50, (3, 16))
    lengths = torch.tensor([16, 10, 7])
    labels = torch.tensor([[3, 5], [0, 0], [6, 6]])
    out = model(ids, lengths=lengths, labels=labels)
    h = model.encode(ids, lengths=lengths)
    logits = h @ model.classifier[1].weight.T + model.classifier[1].bias
    torch.testing.assert_close(out.logits, logits)
    expected = sum(torch.stack([F.cross_entropy(logits[b, :lengths[b], k], labels[b, k])
                                for b in range(3)]).mean() for k in range(2)) / 2
    torch.testing.assert_close(out.loss, expected)
    with pytest.raises(ValueError, match="num_labels must be 2, got 3"):
        ModelConfig(arch="bert", pooling="span", num_labels=3)


def test_squad_scores_by_hand():
    assert normalize_answer("  The Black-Sea, an  ocean!") == "blacksea ocean"
    # gold "black sea", predicted "black sea coast": precision 2/3, recall 1
    assert f1("the Black Sea", "Black Sea coast") == pytest.approx(0.8)
    assert question_scores(["the Black Sea", "Black Sea"], "black sea.") == (1.0, 1.0)
    assert question_scores(["Vienna"], "Budapest") == (0.0, 0.0)
    assert question_scores([], "") == (1.0, 1.0) and question_scores([], "Vienna") == (0.0, 0.0)
    scores = squad_scores([["the Black Sea"], ["Vienna and Budapest"], []],
                          ["Black Sea coast", "Vienna", ""])
    # F1s 0.8, 0.5 (precision 1, recall 1/3: "and" is no article) and 1; exact 0, 0, 1
    assert scores == pytest.approx({"exact": 1 / 3, "f1": (0.8 + 0.5 + 1) / 3,
                                    "has_ans_exact": 0.0, "has_ans_f1": (0.8 + 0.5) / 2,
                                    "no_ans_exact": 1.0, "no_ans_f1": 1.0})
    assert set(squad_scores([["a b"]], ["b"])) == {"exact", "f1"}


def test_the_best_span_is_read_over_all_windows_within_the_rules():
    """Logits set by hand: the best span lies in the second window; a longer or reversed
    one scores higher but is not allowed; [CLS] wins only when no answer is allowed."""
    context = " ".join(f"w{k}" for k in range(30))
    question = Question("q", "which?", context, ())
    encoded = EncodedQA([question], tokenizer(), 24, "test", stride=6)
    rows = list(range(len(encoded)))
    assert len(rows) >= 3
    logits = [torch.zeros(len(r.ids), 2) for r in encoded.rows]
    target = encoded.rows[1]
    i, j = target.firsts[8], target.firsts[9]  # in the middle of the second window
    logits[1][i, 0], logits[1][j, 1] = 5.0, 4.0
    logits[1][target.firsts[10], 0] = 8.0  # a start after every high end: never with one
    logits[2][encoded.rows[2].firsts[0], 0] = 20.0  # an edge piece, read best elsewhere
    found = best_answer(encoded, 0, rows, logits, no_answer=False, max_answer=30)
    spans = encoded.pieces[0].spans
    first, last = target.first + 8, target.first + 9
    assert (found.start, found.end) == (spans[first][0], spans[last][1])
    assert found.text == context[found.start:found.end] and found.score == 9.0
    short = best_answer(encoded, 0, rows, logits, no_answer=False, max_answer=1)
    one = spans[target.first + 10]  # one piece: the start of 8 with the end of 0 there
    assert (short.start, short.end, short.score) == (one[0], one[1], 8.0)
    for r in rows:
        logits[r][0] = 10.0
    assert best_answer(encoded, 0, rows, logits, no_answer=True).text == ""
    assert best_answer(encoded, 0, rows, logits, no_answer=True, threshold=20.0).text
    assert best_answer(encoded, 0, rows, logits, no_answer=False).text


@pytest.fixture(scope="module")
def answerer(tmp_path_factory):
    out = tmp_path_factory.mktemp("qa") / "run"
    pygpt.train.main(["--task", "qa", "--data", str(FIXTURE), "--out", str(out),
                      "--vocab-size", "200", "--max-iters", "40", "--eval-interval", "20",
                      "--lr", "3e-3", "--warmup-iters", "5", *SHAPE])
    return out


def test_training_logs_the_squad_scores_of_the_saved_model(answerer, tmp_path):
    """The last evaluation's exact match and F1 are those of the checkpoint's answers to the
    held-out paragraphs' questions, and pygpt.answer --data prints them."""
    assert load_labels(answerer) == SPAN_LABELS
    model, tokenizer = pygpt.load(answerer)
    model.eval()
    _, val = held_out(read_squad(FIXTURE), VAL_FRACTION, SPLIT_SEED, FIXTURE, "paragraph")
    questions = questions_of(val)
    encoded = EncodedQA(questions, tokenizer, model.config.block_size)
    scores = answers_scored(questions, predict_answers(model, encoded, no_answer=True))
    last = metrics(answerer)[-1]
    for name, value in scores.items():
        assert last[f"val_{name}"] == pytest.approx(value), name
    data = tmp_path / "val.json"
    data.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": p.context, "qas": [{"id": q.id, "question": q.question,
                                         "is_impossible": not q.answers,
                                         "answers": [a._asdict() | {"answer_start": a.start}
                                                     for a in q.answers]} for q in p.questions]}
        for p in val]}]}))
    out = run(pygpt.answer.main, ["--ckpt", str(answerer), "--data", str(data)]).splitlines()
    assert out[0] == (f"exact match {scores['exact']:.4f}, F1 {scores['f1']:.4f} over "
                      f"{len(questions)} questions")


def test_val_data_is_scored_whole_and_a_resumed_run_keeps_its_head(tmp_path):
    """--val-data: all its questions are scored (the fixture's v2.0 kinds apart); --resume
    continues an answerer with its span labels."""
    out = tmp_path / "run"
    pygpt.train.main(["--task", "qa", "--data", str(FIXTURE), "--val-data", str(FIXTURE),
                      "--out", str(out), "--vocab-size", "200", "--max-iters", "2",
                      "--eval-interval", "2", *SHAPE])
    model, tokenizer = pygpt.load(out)
    questions = questions_of(read_squad(FIXTURE))
    scores = answers_scored(questions, predict_answers(
        model.eval(), EncodedQA(questions, tokenizer, model.config.block_size), True))
    assert metrics(out)[-1]["val_f1"] == pytest.approx(scores["f1"])
    assert "val_no_ans_exact" in metrics(out)[-1]
    pygpt.train.main(["--out", str(out), "--resume", "--max-iters", "3", "--quiet"])
    assert metrics(out)[-1]["step"] == 3 and load_labels(out) == SPAN_LABELS


def test_answer_prints_a_span_of_the_context(answerer):
    context = "The Rhine rises in the Swiss Alps and flows north to the North Sea."
    lines = run(pygpt.answer.main, ["--ckpt", str(answerer), "--question",
                                    "Where does the Rhine rise?", "--context", context,
                                    "--dtype", "bfloat16"]).splitlines()
    span, text = lines[0].removeprefix("answer [").split("): ", 1)
    start, end = (int(x) for x in span.split(", "))
    assert context[start:end] == text and lines[1].startswith("score ")
    lines = run(pygpt.answer.main, ["--ckpt", str(answerer), "--question", "Where?",
                                    "--context", context, "--no-answer", "--null-threshold",
                                    "-1000"]).splitlines()
    assert lines[0].startswith("no answer: [CLS] scores ")


@pytest.mark.parametrize("args, message", [
    ([], "give either --data"),
    (["--question", "a"], "--question needs --context"),
    (["--question", "a", "--context", " \n"], "--context is empty"),
    (["--question", "where " * 40, "--context", "x"], "--question: the question's 160 pieces "
                                                       "leave no room"),
    (["--data", str(FIXTURE), "--context", "x"], "--context goes with --question"),
])
def test_answer_refusals_are_one_line(answerer, args, message):
    with pytest.raises(SystemExit) as e:
        pygpt.answer.main(["--ckpt", str(answerer), *args])
    assert str(e.value).startswith(f"error: {message}") and "\n" not in str(e.value)


def test_a_bad_data_file_is_one_line(answerer, tmp_path):
    path = squad_file(tmp_path, {"answers": [{"text": "Alps", "answer_start": 0}]})
    with pytest.raises(SystemExit, match=f"^error: {path}, question 'q1': answer 'Alps' is not "
                                         "at answer_start 0"):
        pygpt.answer.main(["--ckpt", str(answerer), "--data", str(path)])


def test_refusals(answerer, tmp_path):
    """An answerer is not a classifier, nor served yet; another pooling does
    not fit --task qa; it distils nothing yet; pygpt.answer needs an answerer."""
    with pytest.raises(SystemExit, match="error: .*holds a question answerer"):
        pygpt.classify.main(["--ckpt", str(answerer), "--text", "a"])
    with pytest.raises(SystemExit, match="error: --pooling token does not fit --task qa"):
        pygpt.train.main(["--task", "qa", "--pooling", "token", "--data", str(FIXTURE),
                          "--out", str(tmp_path / "x"), *SHAPE])
    with pytest.raises(SystemExit, match="error: --distill-from .* not yet --task qa"):
        pygpt.train.main(["--task", "qa", "--distill-from", str(answerer), "--data",
                          str(FIXTURE), "--out", str(tmp_path / "x"), *SHAPE])
    model, tokenizer = pygpt.load(answerer)
    from pygpt.storage import checkpoint
    checkpoint.save(tmp_path / "pretrained", BERT(ModelConfig(arch="bert", vocab_size=
                                                              tokenizer.vocab_size,
                                                              block_size=32, n_layer=1,
                                                              n_head=2, n_embd=16)), tokenizer)
    with pytest.raises(SystemExit, match="error: .* holds no question answerer"):
        pygpt.answer.main(["--ckpt", str(tmp_path / "pretrained"), "--question", "a",
                           "--context", "b"])
