"""An entity tagger's side of a text, shared by pygpt (pygpt.data.conll, pygpt.tag) and the
runtime (onnx_bert.py), in plain Python: a sentence's words in the model's rows (one row when
they fit, else rows split at words that overlap, each word then read where its row gives it the
most context: windows.best_windows), the entities BIO tags mark, and how the tag commands print
the entities of a text (python -m pygpt.tag --text and pygpt-run alike)."""
from __future__ import annotations

from typing import NamedTuple, Sequence

OUTSIDE = "O"
OVERLAP_SHARE = 4  # a long sentence's rows overlap by a quarter of a row's pieces


class Entity(NamedTuple):
    type: str
    start: int  # its first word
    end: int  # one past its last word


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


class WordRow(NamedTuple):
    """A model row over part of a sentence: [CLS] its words' pieces [SEP]."""
    ids: list[int]
    first: int  # the sentence's first word in it
    firsts: list[int]  # the position of each of its words' first piece


def overlap_for(block_size: int) -> int:
    """The overlap (in pieces) of a long sentence's rows in a context of block_size."""
    return max(block_size - 2, 0) // OVERLAP_SHARE


def word_rows(pieces: Sequence[Sequence[int]], cls: int, sep: int, most: int,
              overlap: int) -> list[WordRow]:
    """A sentence's words (their pieces) in rows of at most `most` positions: one row when they
    fit; else rows that end at word boundaries, each after the first starting at least
    `overlap` pieces before the end of the one before (so every word is read with context on
    both sides in some row). A word of more pieces than a row holds keeps its first ones."""
    room = most - 2
    if room < 1 or not 0 <= overlap < room:
        raise ValueError(f"a row of {most} positions with an overlap of {overlap} holds no word")
    if not all(pieces):
        raise ValueError("every word needs at least one piece")
    sizes = [min(len(p), room) for p in pieces]
    rows, start = [], 0
    while True:
        end, used = start, 0
        while end < len(sizes) and used + sizes[end] <= room:
            used += sizes[end]
            end += 1
        ids, firsts = [cls], []
        for w in range(start, end):
            firsts.append(len(ids))
            ids += pieces[w][:sizes[w]]
        rows.append(WordRow([*ids, sep], start, firsts))
        if end >= len(sizes):
            return rows
        back, kept = end, 0  # the next row repeats the last words of at least `overlap` pieces
        while back - 1 > start and kept < overlap:
            back -= 1
            kept += sizes[back]
        start = back if back > start else end


def text_entities(tags: Sequence[str], spans: Sequence[tuple[int, int]]
                  ) -> list[tuple[str, int, int]]:
    """The entities that tags (one a word) mark in a text whose words are at spans (its
    characters [start, end), pygpt_runtime.text.word_spans): (type, start, end) each, in
    order."""
    return [(e.type, spans[e.start][0], spans[e.end - 1][1]) for e in entities(tags)]


def entity_lines(text: str, found: Sequence[tuple[str, int, int]]) -> list[str]:
    """What the tag commands print for text's entities found (text_entities): "TYPE [start,
    end): words" a line, its whitespace runs as single spaces; "no entities" for none."""
    return ([f"{kind} [{start}, {end}): {' '.join(text[start:end].split())}"
             for kind, start, end in found] or ["no entities"])
