"""The official SQuAD scores of predicted answers (v1.1's and v2.0's evaluation scripts):
exact match and token F1 of the normalised texts (lower case, punctuation and the articles a,
an, the removed, whitespace collapsed), each the best over a question's gold answers; an
unanswerable question's gold answer is the empty text, which only an empty prediction matches.
Means over the questions, as fractions (the scripts print them times 100), for all of them and,
where a set holds both kinds, the answerable (has_ans) and the unanswerable (no_ans) apart."""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

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
