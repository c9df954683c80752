"""A question answerer's SQuAD files, shared by pygpt (pygpt.data.squad, pygpt.tasks.qa,
pygpt.answer) and the runtime (onnx_bert.py), in plain Python: reading a v1.1 or v2.0 file,
SQuAD's official scores of predicted answers, and the report the answer commands print for a
file (python -m pygpt.answer --data and pygpt-run alike).

A file is {"data": [{"paragraphs": [{"context": C, "qas": [{"id", "question", "answers":
[{"text", "answer_start"}], "is_impossible"}]}]}]} ("title", "version" and v2.0's
"plausible_answers" are allowed and unread). An answerable question needs an answer whose text
is the context's at answer_start; v2.0's unanswerable ones (is_impossible true) have none, and
their answer is the [CLS] token. Every problem (a missing field, a wrong type, an answer not at
its answer_start, an empty context or question) is a ValueError naming the file and the
question's id (or the paragraph's place, for a paragraph's own fields).

The scores are those of v1.1's and v2.0's evaluation scripts: exact match and token F1 of the
normalised texts (lower case, punctuation and the articles a, an, the removed, whitespace
collapsed), each the best over a question's gold answers; an unanswerable question's gold answer
is the empty text, which only an empty prediction matches. Means over the questions, as
fractions (the scripts print them times 100), for all of them and, where a set holds both kinds,
the answerable (has_ans) and the unanswerable (no_ans) apart.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence, Union

from pygpt_runtime.answering import Prediction
from pygpt_runtime.json_file import read_json


class Answer(NamedTuple):
    text: str
    start: int  # its first character in the context


class Question(NamedTuple):
    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # empty: unanswerable (v2.0's is_impossible)


class Paragraph(NamedTuple):
    context: str
    questions: list[Question]


def _field(obj: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    """obj[name], which must be of type kind; a ValueError naming where otherwise."""
    if name not in obj:
        raise ValueError(f"{where}: no {name!r}")
    value = obj[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: {name!r} must be a {kind.__name__}, got "
                         f"{type(value).__name__}")
    return value


def _question(qa: Any, context: str, path: Path, where: str) -> Question:
    """A question object of the file path, checked; where names its place until its id is
    known."""
    if not isinstance(qa, dict):
        raise ValueError(f"{where}: a question must be an object")
    qid = _field(qa, "id", str, where)
    if not qid:
        raise ValueError(f"{where}: empty 'id'")
    where = f"{path}, question {qid!r}"
    text = _field(qa, "question", str, where)
    if not text.strip():
        raise ValueError(f"{where}: empty question")
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise ValueError(f"{where}: 'is_impossible' must be true or false")
    answers = []
    for a in _field(qa, "answers", list, where) if not impossible else qa.get("answers") or []:
        if not isinstance(a, dict):
            raise ValueError(f"{where}: an answer must be an object")
        answer, start = _field(a, "text", str, where), _field(a, "answer_start", int, where)
        if not answer.strip():
            raise ValueError(f"{where}: empty answer text")
        if context[start:start + len(answer)] != answer or start < 0:
            found = context[max(start, 0):max(start, 0) + len(answer)]
            raise ValueError(f"{where}: answer {answer[:40]!r} is not at answer_start {start} "
                             f"(the context there reads {found[:40]!r})")
        answers.append(Answer(answer, start))
    if impossible and answers:
        raise ValueError(f"{where}: is_impossible, yet it has answers")
    if not impossible and not answers:
        raise ValueError(f"{where}: no answers (and not is_impossible)")
    return Question(qid, text, context, tuple(answers))


def read_squad(path: Union[str, Path]) -> list[Paragraph]:
    """The paragraphs of a SQuAD file, each with its questions (module docstring)."""
    path = Path(path)
    try:
        top = read_json(path, "SQuAD JSON")
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    if not isinstance(top, dict):
        raise ValueError(f"{path}: SQuAD JSON is an object with a 'data' list")
    paragraphs = []
    for a, article in enumerate(_field(top, "data", list, str(path))):
        where = f"{path}, article {a}"
        if not isinstance(article, dict):
            raise ValueError(f"{where}: an article must be an object")
        for p, paragraph in enumerate(_field(article, "paragraphs", list, where)):
            where = f"{path}, article {a}, paragraph {p}"
            if not isinstance(paragraph, dict):
                raise ValueError(f"{where}: a paragraph must be an object")
            context = _field(paragraph, "context", str, where)
            qas = _field(paragraph, "qas", list, where)
            if not context.strip():
                names = ", ".join(repr(q.get("id")) for q in qas if isinstance(q, dict))
                raise ValueError(f"{where}: empty context" + (f" (questions {names})"
                                                              if names else ""))
            paragraphs.append(Paragraph(context, [
                _question(qa, context, path, f"{where}, question {k}")
                for k, qa in enumerate(qas)]))
    if not any(p.questions for p in paragraphs):
        raise ValueError(f"{path}: no questions")
    return paragraphs


def questions_of(paragraphs: Sequence[Paragraph]) -> list[Question]:
    return [q for p in paragraphs for q in p.questions]


ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The scripts' normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact(gold: str, predicted: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(predicted))


def f1(gold: str, predicted: str) -> float:
    """Token F1 of the normalised texts (1 when both are empty, 0 when only one is)."""
    gold_words = normalize_answer(gold).split()
    predicted_words = normalize_answer(predicted).split()
    if not gold_words or not predicted_words:
        return float(gold_words == predicted_words)
    same = sum((Counter(gold_words) & Counter(predicted_words)).values())
    if not same:
        return 0.0
    precision, recall = same / len(predicted_words), same / len(gold_words)
    return 2 * precision * recall / (precision + recall)


def question_scores(golds: Sequence[str], predicted: str) -> tuple[float, float]:
    """(exact match, F1) of predicted against the best of golds (an empty list, or only
    answers that normalise to nothing: unanswerable, the gold is "")."""
    golds = [g for g in golds if normalize_answer(g)] or [""]
    return max(exact(g, predicted) for g in golds), max(f1(g, predicted) for g in golds)


def squad_scores(golds: Sequence[Sequence[str]], predicted: Sequence[str]) -> dict[str, float]:
    """exact and f1 means over the questions (each question's gold answers in golds, its
    predicted text in predicted, "" for none), and has_ans_ / no_ans_ ones over each kind when
    both are there."""
    if len(golds) != len(predicted) or not golds:
        raise ValueError(f"{len(golds)} questions and {len(predicted)} predictions to score")
    scores = [question_scores(g, p) for g, p in zip(golds, predicted)]
    answerable = [any(normalize_answer(a) for a in g) for g in golds]
    result = {"exact": sum(e for e, _ in scores) / len(scores),
              "f1": sum(f for _, f in scores) / len(scores)}
    if any(answerable) and not all(answerable):
        for name, kind in (("has_ans", True), ("no_ans", False)):
            part = [s for s, a in zip(scores, answerable) if a == kind]
            result[f"{name}_exact"] = sum(e for e, _ in part) / len(part)
            result[f"{name}_f1"] = sum(f for _, f in part) / len(part)
    return result


def answers_scored(questions: Sequence[Question],
                   predictions: Sequence[Prediction]) -> dict[str, float]:
    """SQuAD's scores (squad_scores) of predictions for questions."""
    return squad_scores([[a.text for a in q.answers] for q in questions],
                        [p.text for p in predictions])


def unanswerable(questions: Sequence[Question]) -> int:
    return sum(not q.answers for q in questions)


def report(scores: dict[str, float], questions: int) -> str:
    """Exact match and F1 over all the questions, then over each kind where both are there."""
    lines = [f"exact match {scores['exact']:.4f}, F1 {scores['f1']:.4f} over {questions} "
             "questions"]
    for kind, what in (("has_ans", "answerable"), ("no_ans", "unanswerable")):
        if f"{kind}_exact" in scores:
            lines.append(f"{what}: exact match {scores[f'{kind}_exact']:.4f}, F1 "
                         f"{scores[f'{kind}_f1']:.4f}")
    return "\n".join(lines)
