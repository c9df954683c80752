"""Token-tagged text in the CoNLL format, for named-entity tagging (--task tag): reading a file,
the entities its tags mark, the label set, and a sentence's rows for the model (its words'
WordPiece pieces, the tag on each word's first piece; a sentence longer than the context split at
words into overlapping rows, each word predicted from the row that reads it with the most
context).

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


IGNORED = -100  # the loss's ignore_index: the specials, and every piece of a word but its first


class Window(NamedTuple):
    """A model row over part of a sentence: [CLS] its words' pieces [SEP]."""
    ids: list[int]
    labels: list[int]  # per position: the word's tag id at its first piece, else IGNORED
    first: int  # the sentence's first word in it
    firsts: list[int]  # the position of each of its words' first piece


def windows(pieces: Sequence[Sequence[int]], tag_ids: Sequence[int], cls: int, sep: int,
            most: int, overlap: int) -> list[Window]:
    """A sentence's words (their pieces, their tag ids) in rows of at most `most` positions: one
    row when they fit; else rows that end at word boundaries, each after the first starting at
    least `overlap` pieces before the end of the one before (so every word is read with context
    on both sides in some row). A word of more pieces than a row holds keeps its first ones."""
    room = most - 2
    if room < 1 or not 0 <= overlap < room:
        raise ValueError(f"a row of {most} positions with an overlap of {overlap} holds no word")
    sizes = [min(max(len(p), 1), room) for p in pieces]
    rows, start = [], 0
    while True:
        end, used = start, 0
        while end < len(sizes) and used + sizes[end] <= room:
            used += sizes[end]
            end += 1
        rows.append(_window(pieces, tag_ids, sizes, start, end, cls, sep))
        if end >= len(sizes):
            return rows
        back, kept = end, 0  # the next row repeats the last words of at least `overlap` pieces
        while back - 1 > start and kept < overlap:
            back -= 1
            kept += sizes[back]
        start = back if back > start else end


def _window(pieces: Sequence[Sequence[int]], tag_ids: Sequence[int], sizes: Sequence[int],
            start: int, end: int, cls: int, sep: int) -> Window:
    ids, labels, firsts = [cls], [IGNORED], []
    for w in range(start, end):
        firsts.append(len(ids))
        word = list(pieces[w][:sizes[w]])
        ids += word
        labels += [tag_ids[w]] + [IGNORED] * (len(word) - 1)
    return Window(ids + [sep], labels + [IGNORED], start, firsts)


def best_windows(rows: Sequence[Window], n_words: int) -> list[tuple[int, int]]:
    """For each word of a sentence, the row that reads it with the most context (the larger of
    its words before and after being the smaller, as for a document stride) and its position
    there: where its prediction is taken."""
    best: list[tuple[int, int, int]] = [(-1, -1, -1)] * n_words  # (context, row, position)
    for r, row in enumerate(rows):
        for k, at in enumerate(row.firsts):
            word = row.first + k
            context = min(k, len(row.firsts) - 1 - k)
            if context > best[word][0]:
                best[word] = (context, r, at)
    return [(r, at) for _, r, at in best]
