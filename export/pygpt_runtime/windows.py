"""A text read in overlapping rows (a long sentence by an entity tagger, a long context by a
question answerer): the row that reads each of its units with the most context, where that
unit's prediction is taken. Shared by pygpt (pygpt.tasks.tagging, pygpt.tasks.qa) and the
runtime (onnx_bert.py); plain Python."""
from __future__ import annotations

from typing import Protocol, Sequence


class TextWindow(Protocol):
    """A row over part of a longer text: the text's unit (a word, a piece) at its start, and
    the row position of each of its units."""
    first: int
    firsts: list[int]


def best_windows(rows: Sequence[TextWindow], n_units: int) -> list[tuple[int, int]]:
    """For each unit of a text read in overlapping rows, the row that reads it with the most
    context (the larger of its units before and after in the row being the smaller, as for a
    document stride; the first such row) and its position there: where its prediction is
    taken. (-1, -1) for a unit no row holds."""
    best: list[tuple[int, int, int]] = [(-1, -1, -1)] * n_units  # (context, row, position)
    for r, row in enumerate(rows):
        for k, at in enumerate(row.firsts):
            unit = row.first + k
            context = min(k, len(row.firsts) - 1 - k)
            if context > best[unit][0]:
                best[unit] = (context, r, at)
    return [(r, at) for _, r, at in best]
