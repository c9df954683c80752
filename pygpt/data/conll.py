"""Token-tagged text in the CoNLL format, for named-entity tagging (--task tag): reading a file,
the entities its tags mark, and the label set.

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

from pathlib import Path
from typing import NamedTuple, Sequence, Union

DOCUMENT_START = "-DOCSTART-"
OUTSIDE = "O"


class Sentence(NamedTuple):
    words: tuple[str, ...]
    tags: tuple[str, ...]  # BIO, repaired
    line: int  # of its first word, for error messages


class Tagged(NamedTuple):
    sentences: list[Sentence]
    repaired: int  # I- tags read as B- (they began an entity)


class Entity(NamedTuple):
    type: str
    start: int  # its first word
    end: int  # one past its last word


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


def entities(tags: Sequence[str]) -> list[Entity]:
    """The entities BIO tags mark, in order (an I- that begins one counts as its B-)."""
    found: list[Entity] = []
    kind, start = None, 0
    for i, tag in enumerate([*tags, OUTSIDE]):
        continues = tag.startswith("I-") and tag[2:] == kind
        if kind is not None and not continues:
            found.append(Entity(kind, start, i))
            kind = None
        if tag != OUTSIDE and not continues:
            kind, start = tag[2:], i
    return found


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


def labels(sentences: Sequence[Sentence]) -> list[str]:
    """The tags a model predicts: O, then each type's B- and I-, types sorted (an I- is there
    even when the data holds only one-word entities of its type)."""
    kinds = sorted({tag[2:] for s in sentences for tag in s.tags if tag != OUTSIDE})
    return [OUTSIDE, *(f"{p}-{kind}" for kind in kinds for p in "BI")]
