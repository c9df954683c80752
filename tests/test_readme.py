"""README.md's code map tells the truth about the tree: every pygpt/ module and folder and every
pygpt_runtime module it names exists, and it names every pygpt/ package and root module and every
pygpt_runtime module. The map is the fenced block under "## Code map"; a line indented two spaces
under `pygpt/` starts an entry (`name/` a folder, or root modules `name.py ...`), and the `.py`
names on an entry's lines (and its continuation lines, indented further) are in that folder."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "pygpt"
RUNTIME = REPO / "export" / "pygpt_runtime"
ENTRY = re.compile(r"^  (\w+/|\w+\.py)")
MODULE = re.compile(r"\b\w+\.py\b")


def code_map() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Code map\n", 1)[1]
    return section.split("```", 2)[1].splitlines()


def block(top: str) -> list[str]:
    """The lines of the map's top-level entry `top` (e.g. "pygpt/"): its own and those below it
    up to the next top-level entry."""
    lines = code_map()
    start = next(i for i, line in enumerate(lines) if line.split(" ", 1)[0] == top)
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i].startswith(" ")), len(lines))
    return lines[start:end]


def named_in_package() -> set[Path]:
    """The paths the pygpt/ block names: its folders, and each .py name in its entry's folder."""
    named, folder = set(), PACKAGE
    for line in block("pygpt/")[1:]:
        entry = ENTRY.match(line)
        if entry:
            folder = PACKAGE / entry.group(1) if entry.group(1).endswith("/") else PACKAGE
            if folder != PACKAGE:
                named.add(folder)
        named.update(folder / name for name in MODULE.findall(line))
    return named


def test_every_pygpt_path_in_the_map_exists():
    missing = sorted(str(p.relative_to(REPO)) for p in named_in_package() if not p.exists())
    assert not missing, f"README.md's code map names what is not there: {missing}"


def test_the_map_names_every_pygpt_package_and_root_module():
    named = named_in_package()
    wanted = [p for p in sorted(PACKAGE.iterdir())
              if (p.is_dir() and not p.name.startswith(("_", ".")))
              or (p.suffix == ".py" and not p.name.startswith("_"))]
    unnamed = sorted(str(p.relative_to(REPO)) for p in wanted if p not in named)
    assert not unnamed, f"README.md's code map leaves out: {unnamed}"


def test_the_map_names_the_runtime_modules_that_exist():
    named = {name for line in block("export/") for name in MODULE.findall(line)}
    modules = {p.name for p in RUNTIME.glob("*.py") if not p.name.startswith("_")}
    assert named == modules, (f"README.md's code map of export/pygpt_runtime: not there "
                              f"{sorted(named - modules)}, left out {sorted(modules - named)}")
