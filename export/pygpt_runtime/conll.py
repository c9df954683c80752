"""An entity tagger's CoNLL files, shared by pygpt (pygpt.data.conll, pygpt.tasks.tagging,
pygpt.tag) and the runtime (onnx_bert.py), in plain Python: reading one, entity-level precision,
recall and F1 by exact span match (conlleval's rule, which seqeval follows: a predicted entity
counts only when its type, first and last word all equal a gold entity's; per type, and
micro-averaged over all entities), and the report the tag commands print for a file
(python -m pygpt.tag --data and pygpt-run alike).

A file is UTF-8 text, one word a line: the word, whitespace, then its tag as the line's last
column (so CoNLL-2003's four columns read as well as "word TAB tag"); a blank line ends a
sentence, and CoNLL-2003's "-DOCSTART-" lines are skipped. Tags are BIO (IOB2): O outside an
entity, B-TYPE at an entity's first word, I-TYPE inside it. An I-TYPE that does not continue an
entity of its type (after O, after another type, at a sentence's start: an IOB1 file such as
CoNLL-2003's own, or a slip) begins a new entity, as conlleval and seqeval read it; reading
rewrites it as B-TYPE and counts it (`repaired`), so that training learns one scheme. Any other
tag (BIOES's S- and E-, a bare type) is refused, as is a line with no tag. Every problem is a
ValueError naming the file and line.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple, Sequence, Union

from pygpt_runtime.tagging import OUTSIDE, entities

DOCUMENT_START = "-DOCSTART-"


class Sentence(NamedTuple):
    words: tuple[str, ...]
    tags: tuple[str, ...]  # BIO, repaired
    line: int  # of its first word, for error messages


class Tagged(NamedTuple):
    sentences: list[Sentence]
    repaired: int  # I- tags read as B- (they began an entity)


def _check_tag(tag: str, where: str) -> None:
    if tag == OUTSIDE:
        return
    prefix, dash, kind = tag.partition("-")
    if not (dash and prefix in ("B", "I") and kind and kind.isprintable() and kind.strip() == kind):
        raise ValueError(f"{where}: tag {tag[:40]!r} is not O, B-TYPE or I-TYPE: tags must be "
                         "BIO (IOB2; an IOB1 file such as CoNLL-2003's reads as BIO too)")


def repair(tags: Sequence[str]) -> tuple[list[str], int]:
    """tags with every I-TYPE that does not continue an entity of its type made B-TYPE, and
    how many were."""
    out, fixed, before = [], 0, OUTSIDE
    for tag in tags:
        if tag.startswith("I-") and before[2:] != tag[2:]:
            tag, fixed = "B-" + tag[2:], fixed + 1
        out.append(tag)
        before = tag
    return out, fixed


def read_conll(path: Union[str, Path]) -> Tagged:
    """The sentences of a CoNLL file (module docstring)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    first, repaired = 0, 0

    def end_sentence() -> None:
        nonlocal repaired
        if words:
            fixed_tags, fixed = repair(tags)
            repaired += fixed
            sentences.append(Sentence(tuple(words), tuple(fixed_tags), first))
            words.clear()
            tags.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        columns = line.split()
        if not columns:
            end_sentence()
            continue
        if columns[0] == DOCUMENT_START:
            end_sentence()
            continue
        where = f"{path}, line {number}"
        if len(columns) < 2:
            raise ValueError(f"{where}: {columns[0][:40]!r} has no tag; each line holds a word "
                             "and its tag, separated by whitespace")
        _check_tag(columns[-1], where)
        if not words:
            first = number
        words.append(columns[0])
        tags.append(columns[-1])
    end_sentence()
    if not sentences:
        raise ValueError(f"{path}: no tagged words")
    return Tagged(sentences, repaired)


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


def report(scores: dict[str, EntityScore]) -> str:
    """A table: precision, recall, F1 and gold entities of each type, then the micro average."""
    width = max(len(kind) for kind in scores)
    lines = [f"{'type'.ljust(width)}  precision  recall      f1  support"]
    for kind, s in scores.items():
        lines.append(f"{kind.ljust(width)}  {s.precision:9.4f}  {s.recall:6.4f}  {s.f1:6.4f}  "
                     f"{s.support:7d}")
    return "\n".join(lines)


def file_report(tagged: Tagged, scores: dict[str, EntityScore]) -> str:
    """What the tag commands print for a CoNLL file: the I- tags read as B- (when any), then
    the report of the tagger's scores on it."""
    repaired = ([f"{tagged.repaired} I- tags that began an entity were read as B- (conlleval's "
                 "reading)"] if tagged.repaired else [])
    return "\n".join([*repaired, report(scores)])
