"""docs/design.md's code map tells the truth about the tree: every module and folder it names
under pygpt/ and export/pygpt_runtime/ exists, and it names every package and module of both.
The map is the fenced block under "## Code map"; a top-level line (`pygpt/`,
`export/pygpt_runtime/`) starts a package's block, a line indented two spaces under it starts an
entry (`name/` a subfolder, or modules `name.py ...` of the package's own folder), and the `.py`
names on an entry's lines (and its continuation lines, indented further) are in that folder."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"pygpt/": REPO / "pygpt", "export/pygpt_runtime/": REPO / "export" / "pygpt_runtime"}
ENTRY = re.compile(r"^  (\w+/|\w+\.py)")
MODULE = re.compile(r"\b\w+\.py\b")


def code_map() -> list[str]:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Code map\n", 1)[1]
    return section.split("```", 2)[1].splitlines()


def block(top: str) -> list[str]:
    """The lines of the map's top-level entry `top`: its own and those below it up to the next
    top-level entry."""
    lines = code_map()
    start = next(i for i, line in enumerate(lines) if line.split(" ", 1)[0] == top)
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i].startswith(" ")), len(lines))
    return lines[start:end]


def named_in(top: str) -> set[Path]:
    """The paths the block of `top` names: its folders, and each .py name in its entry's folder."""
    root = PACKAGES[top]
    named, folder = set(), root
    for line in block(top)[1:]:
        entry = ENTRY.match(line)
        if entry:
            folder = root / entry.group(1) if entry.group(1).endswith("/") else root
            if folder != root:
                named.add(folder)
        named.update(folder / name for name in MODULE.findall(line))
    return named


def existing(root: Path) -> list[Path]:
    """A package's subpackages and modules, and its subpackages' modules (not __init__ & co.)."""
    found = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and (p / "__init__.py").exists():
            found.append(p)
            found += [m for m in sorted(p.glob("*.py")) if not m.name.startswith("_")]
        elif p.suffix == ".py" and not p.name.startswith("_"):
            found.append(p)
    return found


@pytest.mark.parametrize("top", PACKAGES)
def test_every_path_in_the_map_exists(top):
    missing = sorted(str(p.relative_to(REPO)) for p in named_in(top) if not p.exists())
    assert not missing, f"docs/design.md's code map names what is not there: {missing}"


@pytest.mark.parametrize("top", PACKAGES)
def test_the_map_names_every_package_and_module(top):
    named = named_in(top)
    unnamed = sorted(str(p.relative_to(REPO)) for p in existing(PACKAGES[top]) if p not in named)
    assert not unnamed, f"docs/design.md's code map leaves out: {unnamed}"


def test_the_checks_see_what_they_look_for():
    """A module the map does not name is found missing from it."""
    named = named_in("pygpt/")
    assert REPO / "pygpt" / "storage" / "atomic.py" in named
    assert REPO / "pygpt" / "nosuch.py" not in named
