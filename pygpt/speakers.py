"""`python -m pygpt.speakers --out DIR`: a labelled data set made from the shipped Shakespeare,
for trying BERT's classification fine-tuning without downloading anything: who, of the N
speakers with the most speeches, says this speech?

The text is a play script: a speech is a speaker line (the name and a colon, alone on a line
after a blank line or at the start) followed by its lines up to the next blank line; a speaker
line with no lines after it is no speech. Each speech becomes one example, its lines joined with
a space, labelled with its speaker's name. Speakers are told apart by name only (the GLOUCESTER
of one play and of another are one label).

DIR/train.tsv and DIR/test.tsv (header `label<TAB>text`, read by pygpt.data.labelled) split each
speaker's speeches alike (stratified): round(--test-fraction * n) of them, at least one and
leaving at least one to train on, drawn with --seed; the same text, speakers and seed give the
same files. Validation during fine-tuning holds out a tenth of train.tsv, never test.tsv.

Leakage. Every speech, test speeches included, is also in the shipped text that
`python -m pygpt.train --arch bert` pretrains on by default (unlabelled, as usual for such a
demonstration: the masked-LM never sees a label, but it has read the test texts and the speaker
line above each). For an honest measurement, --pretrain-text FILE writes the text minus the test
speeches (each with its speaker line and a blank line); pretrain on that instead:

    python -m pygpt.speakers --out runs/speakers --pretrain-text runs/speakers/pretrain.txt
    python -m pygpt.train --arch bert --data runs/speakers/pretrain.txt --out runs/bert
    python -m pygpt.train --task classify --init-from runs/bert --data runs/speakers/train.tsv \\
        --out runs/cls
    python -m pygpt.classify --ckpt runs/cls --data runs/speakers/test.tsv
"""
from __future__ import annotations

import argparse
import csv
import io
import random
from collections import Counter
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from pygpt.data.text import SHIPPED_TEXT, read_text
from pygpt.storage.atomic import atomic_write_text


class Speech(NamedTuple):
    speaker: str  # the name, without its colon
    text: str     # the speech's lines, stripped, joined with a space
    first: int    # the index of its speaker line among the text's lines
    end: int      # one past its last line


def parse_speeches(text: str) -> list[Speech]:
    """Every speech of a play script (see the module's doc), in order."""
    lines = text.split("\n")
    speeches = []
    i = 0
    while i < len(lines):
        name = lines[i].strip()
        starts = (i == 0 or not lines[i - 1].strip()) and len(name) > 1 and name.endswith(":")
        end = i + 1
        while starts and end < len(lines) and lines[end].strip():
            end += 1
        if starts and end > i + 1:
            speeches.append(Speech(name[:-1].strip(), " ".join(line.strip()
                                                               for line in lines[i + 1:end]),
                                   i, end))
            i = end
        else:
            i += 1
    return speeches


def top_speakers(speeches: Sequence[Speech], n: int) -> list[str]:
    """The n speakers with the most speeches, most first (ties: by name); a ValueError if the
    text has fewer."""
    if n < 2:
        raise ValueError(f"--speakers must be at least 2 (a classifier needs two classes), got {n}")
    ranked = sorted(Counter(s.speaker for s in speeches).items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) < n:
        raise ValueError(f"the text has {len(ranked)} speakers with speeches; asked for {n}")
    return [name for name, _ in ranked[:n]]


def split_speeches(speeches: Sequence[Speech], speakers: Sequence[str], test_fraction: float,
                   seed: int = 0) -> tuple[list[Speech], list[Speech]]:
    """(train, test): the speeches of `speakers`, each speaker's split alike (see the module's
    doc), both in text order."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"--test-fraction must be between 0 and 1, got {test_fraction}")
    rng = random.Random(seed)
    test: set[int] = set()
    for name in sorted(speakers):
        idx = [i for i, s in enumerate(speeches) if s.speaker == name]
        if len(idx) < 2:
            raise ValueError(f"{name} has {len(idx)} speech(es); splitting needs at least two")
        take = min(max(round(test_fraction * len(idx)), 1), len(idx) - 1)
        test.update(rng.sample(idx, take))
    chosen = set(speakers)
    return ([s for i, s in enumerate(speeches) if s.speaker in chosen and i not in test],
            [s for i, s in enumerate(speeches) if i in test])


def without_speeches(text: str, speeches: Sequence[Speech]) -> str:
    """text minus the lines of `speeches` (parsed from it), each with the blank line after it
    (before it, for the last speech), so the rest keeps its layout and its speeches."""
    lines = text.split("\n")
    drop: set[int] = set()
    for s in speeches:
        drop.update(range(s.first, s.end))
        if s.end < len(lines) - 1 and not lines[s.end].strip():
            drop.add(s.end)
        elif s.first > 0 and not lines[s.first - 1].strip():
            drop.add(s.first - 1)
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def tsv(speeches: Sequence[Speech]) -> str:
    """The speeches as pygpt.data.labelled reads them: a `label<TAB>text` header, one row each,
    quoted by the csv module where a text holds a tab or a quote."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
    writer.writerow(["label", "text"])
    writer.writerows([s.speaker, s.text] for s in speeches)
    return buffer.getvalue()


def counts_table(train: Sequence[Speech], test: Sequence[Speech], speakers: Sequence[str]) -> str:
    n_train, n_test = Counter(s.speaker for s in train), Counter(s.speaker for s in test)
    width = max(len(name) for name in [*speakers, "speaker", "total"])
    rows = [(name, n_train[name], n_test[name]) for name in speakers]
    rows.append(("total", len(train), len(test)))
    return "\n".join([f"{'speaker'.ljust(width)}  train   test"]
                     + [f"{name.ljust(width)}  {a:5d}  {b:5d}" for name, a, b in rows])


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pygpt.speakers",
                                description=__doc__.split("\n\n")[0].split(":", 1)[1].strip(),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="folder for train.tsv and test.tsv")
    p.add_argument("--speakers", type=int, default=10, help="how many speakers (the most "
                                                             "frequent) to tell apart")
    p.add_argument("--test-fraction", type=float, default=0.2, help="of each speaker's speeches")
    p.add_argument("--seed", type=int, default=0, help="seed of the split")
    p.add_argument("--data", default=None, help="a play script in the same layout (default: "
                                                "the shipped Shakespeare)")
    p.add_argument("--pretrain-text", default=None, help="also write the text minus the test "
                                                         "speeches here, to pretrain on")
    args = p.parse_args(argv)
    try:
        text = read_text(args.data)
        speeches = parse_speeches(text)
        speakers = top_speakers(speeches, args.speakers)
        train, test = split_speeches(speeches, speakers, args.test_fraction, args.seed)
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "train.tsv", tsv(train))
            atomic_write_text(out / "test.tsv", tsv(test))
            if args.pretrain_text is not None:
                atomic_write_text(args.pretrain_text, without_speeches(text, test))
        except OSError as e:
            raise ValueError(f"cannot write the output: {e}") from None
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{len(speeches)} speeches by {len({s.speaker for s in speeches})} speakers in "
          f"{args.data or SHIPPED_TEXT}; the {len(speakers)} with the most:")
    print(counts_table(train, test, speakers))
    print(f"wrote {out / 'train.tsv'} and {out / 'test.tsv'}"
          + (f", and {args.pretrain_text} (the text minus the test speeches)"
             if args.pretrain_text else ""))


if __name__ == "__main__":
    main()
