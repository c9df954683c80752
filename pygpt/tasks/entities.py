"""Named-entity tagging's quality: entity-level precision, recall and F1 by exact span match
(conlleval's rule, which seqeval follows): a predicted entity counts only when its type, first
and last word all equal a gold entity's; per type, and micro-averaged over all entities."""
from __future__ import annotations

from collections import Counter
from typing import NamedTuple, Sequence

from pygpt_runtime.tagging import entities


class EntityScore(NamedTuple):
    precision: float
    recall: float
    f1: float
    support: int  # gold entities

    @staticmethod
    def of(correct: int, predicted: int, gold: int) -> "EntityScore":
        precision = correct / predicted if predicted else 0.0
        recall = correct / gold if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return EntityScore(precision, recall, f1, gold)


def score(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
          ) -> dict[str, EntityScore]:
    """Each entity type's score and the micro average ("micro"), over sentences of BIO tags (a
    predicted sentence's tags against the gold one's, word by word)."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(predicted)} predicted sentences for {len(gold)} gold ones")
    correct: Counter = Counter()
    made: Counter = Counter()
    wanted: Counter = Counter()
    for n, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(p)} predicted tags for {len(g)} words")
        true, guessed = set(entities(g)), set(entities(p))
        for kind, bag in ((wanted, true), (made, guessed), (correct, true & guessed)):
            kind.update(e.type for e in bag)
    scores = {kind: EntityScore.of(correct[kind], made[kind], wanted[kind])
              for kind in sorted(set(wanted) | set(made))}
    scores["micro"] = EntityScore.of(sum(correct.values()), sum(made.values()),
                                     sum(wanted.values()))
    return scores
