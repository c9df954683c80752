"""pygpt.speakers: parsing a play script into speeches, the top-N speakers, the stratified split,
the TSV files (read back by pygpt.data.labelled) and the pretraining text without the test
speeches."""
from collections import Counter

import pytest

from pygpt.data.labelled import read_labelled
from pygpt.speakers import (main, parse_speeches, split_speeches, top_speakers, tsv,
                            without_speeches)

PLAY = """ANNE:
Hear me: this ends with a colon:
And goes on.

BOB:
Short.

CARL:

ANNE:
Again.

BOB:
Twice\tover "quoted".
"""


def text_of(speeches):
    return [(s.speaker, s.text) for s in speeches]


def play(counts):
    """A script where speaker k has counts[k] speeches, interleaved."""
    blocks, left = [], dict(counts)
    while any(left.values()):
        for name in sorted(left):
            if left[name]:
                blocks.append(f"{name}:\n{name.lower()} says {left[name]}\nand more")
                left[name] -= 1
    return "\n\n".join(blocks) + "\n"


def test_parse_speeches():
    speeches = parse_speeches(PLAY)
    # A line ending with ':' inside a speech is not a speaker; CARL has no lines: no speech.
    assert text_of(speeches) == [("ANNE", "Hear me: this ends with a colon: And goes on."),
                                 ("BOB", "Short."), ("ANNE", "Again."),
                                 ("BOB", 'Twice\tover "quoted".')]
    lines = PLAY.split("\n")
    assert [lines[s.first] for s in speeches] == ["ANNE:", "BOB:", "ANNE:", "BOB:"]
    assert all(lines[s.end].strip() == "" for s in speeches)


def test_top_speakers_by_count_then_name():
    speeches = parse_speeches(play({"A": 2, "B": 5, "C": 3, "D": 3}))
    assert top_speakers(speeches, 3) == ["B", "C", "D"]
    with pytest.raises(ValueError, match="at least 2"):
        top_speakers(speeches, 1)
    with pytest.raises(ValueError, match="4 speakers"):
        top_speakers(speeches, 5)


def test_split_is_stratified_deterministic_and_disjoint():
    counts = {"A": 10, "B": 20, "C": 5, "D": 2}
    speeches = parse_speeches(play(counts))
    speakers = ["A", "B", "C"]
    train, test = split_speeches(speeches, speakers, 0.2, seed=0)
    assert Counter(s.speaker for s in test) == {"A": 2, "B": 4, "C": 1}
    assert Counter(s.speaker for s in train) == {"A": 8, "B": 16, "C": 4}
    assert not {s.first for s in train} & {s.first for s in test}
    assert split_speeches(speeches, speakers, 0.2, seed=0) == (train, test)
    assert split_speeches(speeches, speakers, 0.2, seed=1) != (train, test)
    for part in (train, test):  # text order
        assert [s.first for s in part] == sorted(s.first for s in part)
    # At least one each way, even for a tiny speaker or fraction.
    _, test = split_speeches(speeches, ["D", "C"], 0.01)
    assert Counter(s.speaker for s in test) == {"C": 1, "D": 1}
    with pytest.raises(ValueError, match="between 0 and 1"):
        split_speeches(speeches, speakers, 1.0)
    with pytest.raises(ValueError, match="at least two"):
        split_speeches(parse_speeches(play({"A": 1, "B": 3})), ["A", "B"], 0.5)


def test_files_read_back(tmp_path):
    speeches = parse_speeches(PLAY)
    path = tmp_path / "x.tsv"
    path.write_text(tsv(speeches), encoding="utf-8")
    examples = read_labelled(path)
    assert [(e.label, e.text) for e in examples] == text_of(speeches)


def test_pretrain_text_lacks_exactly_the_test_speeches():
    text = play({"A": 9, "B": 6, "C": 4})
    speeches = parse_speeches(text)
    _, test = split_speeches(speeches, ["A", "B", "C"], 0.3)
    rest = without_speeches(text, test)
    assert text_of(parse_speeches(rest)) == text_of(s for s in speeches if s not in test)
    assert rest.endswith("\n") and "\n\n\n" not in rest and not rest.startswith("\n")
    # The first and the last speech too.
    both = [speeches[0], speeches[-1]]
    assert text_of(parse_speeches(without_speeches(text, both))) == text_of(speeches[1:-1])


def test_command_line(tmp_path, capsys):
    data = tmp_path / "play.txt"
    data.write_text(play({"A": 10, "B": 5, "C": 3}), encoding="utf-8")
    out = tmp_path / "out"
    main(["--data", str(data), "--out", str(out), "--speakers", "2",
          "--pretrain-text", str(tmp_path / "pre.txt")])
    assert "total" in capsys.readouterr().out
    train, test = read_labelled(out / "train.tsv"), read_labelled(out / "test.tsv")
    assert (len(train), len(test)) == (12, 3)
    assert {e.label for e in train} == {e.label for e in test} == {"A", "B"}
    assert len(parse_speeches((tmp_path / "pre.txt").read_text())) == 18 - 3
    with pytest.raises(SystemExit, match="at least 2"):
        main(["--data", str(data), "--out", str(out), "--speakers", "1"])
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="cannot write"):
        main(["--data", str(data), "--out", str(tmp_path / "file" / "sub"), "--speakers", "2"])
