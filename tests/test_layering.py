"""The package's structure, checked from its imports: every module sits on a layer, imports only
from its own layer or the layers below (building blocks never reach up into models, models never
into training), and no import cycle exists, not even through imports inside functions. A source
file (pygpt's or the runtime's) past about 300 lines is a hint to look for a second concern in
it, not a rule: the few that are one concern at their length are listed with the reason, and
none grows past 450. And pygpt.ops.registry is the only list of the ops: no other source holds a
literal list of op names, to fall out of step with it."""
import ast
import re
from pathlib import Path

import pytest

from pygpt.ops.registry import OPS

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "pygpt"

# Lowest first. A module belongs to the first layer with a prefix that names it or its package.
LAYERS = [
    ["pygpt._build_info", "pygpt.storage.commit_marker", "pygpt.storage.targets",
     "pygpt.storage.atomic",
     "pygpt.storage.serializers", "pygpt.storage.run_files", "pygpt.positions", "pygpt.config",
     "pygpt.cpu_isa"],
    ["pygpt.tokenizer", "pygpt.data", "pygpt.ops", "pygpt.plot", "pygpt.tasks.bleu",
     "pygpt.mixed_precision"],
    ["pygpt.kernels"],
    ["pygpt.nn"],
    ["pygpt.decoding"],
    ["pygpt.models"],
    ["pygpt.inspect"],  # a model's attention taken apart, drawn and explained
    ["pygpt.tasks"],  # what a family trains for
    ["pygpt.onnx.int8", "pygpt.onnx.graph"],  # int8 quantization; the graphs' common parts
    ["pygpt.onnx"],  # each family's graphs
    ["pygpt.families"],
    ["pygpt.storage"],  # checkpoints: saving, loading, older formats, the --resume state
    ["pygpt.training", "pygpt.pruning"],
    ["pygpt.export", "pygpt.hf"],
    ["pygpt.train", "pygpt.generate", "pygpt.fill_mask", "pygpt.classify", "pygpt.tag",
     "pygpt.answer",
     "pygpt.speakers",
     "pygpt.translate", "pygpt.attention", "pygpt.convert", "pygpt.serve", "pygpt.prune",
     "pygpt"],  # command lines (the server's package), and the package's pygpt.load
]
SOFT_MAX_LINES = 300  # past it, split the file by concern or list it in LONGER with why
HARD_MAX_LINES = 450
# Modules (pygpt's and the runtime's) longer than SOFT_MAX_LINES that are one concern, and why.
LONGER: dict[str, str] = {
    "pygpt_runtime.run_onnx": "a GPT export run end to end: its graph calls, the batched rows "
                              "and their caches, the generation loop and pygpt-run's GPT "
                              "command, which prints what that loop yields",
    "pygpt_runtime.onnx_bert": "a BERT export run end to end: its graph call, each task's "
                               "reading of texts into rows and of logits into answers (fill-"
                               "mask, classify, tag, qa), and pygpt-run's BERT command",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes if p != "pygpt"):
            return i
    if name == "pygpt":
        return len(LAYERS) - 1
    raise AssertionError(f"{name} is on no layer: add it to LAYERS in {__file__}")


def imports_of(name: str) -> set[str]:
    """The pygpt modules that module `name` imports, anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def is_own_package(name: str, dep: str) -> bool:
    """Importing pygpt.nn.block runs pygpt.nn's __init__ first: no step up, no cycle."""
    return name.startswith(dep + ".")


def upward_imports(name: str, graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph[name]
                  if layer_of(m) > layer_of(name) and not is_own_package(name, m))


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of graph as a path (first == last), or [] if there is none."""
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str]:
        state[name] = "open"
        for dep in sorted(graph[name]):
            if is_own_package(name, dep):
                continue
            if state.get(dep) == "open":
                return path[path.index(dep):] + [name, dep] if dep in path else [name, dep]
            if dep not in state:
                cycle = visit(dep, path + [name])
                if cycle:
                    return cycle
        state[name] = "done"
        return []

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name, [])
            if cycle:
                return cycle
    return []


def test_every_module_is_on_a_layer():
    for name in MODULES:
        layer_of(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_only_from_its_layer_or_below(name):
    upward = upward_imports(name, GRAPH)
    assert not upward, f"{name} (layer {layer_of(name)}) imports from higher layers: {upward}"


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


RUNTIME = REPO / "export" / "pygpt_runtime"
SIZED = {**MODULES, **{".".join(p.relative_to(RUNTIME.parent).with_suffix("").parts): p
                       for p in sorted(RUNTIME.rglob("*.py"))}}


def lines_of(name: str) -> int:
    return len(SIZED[name].read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("name", sorted(SIZED))
def test_file_is_small_or_says_why_not(name):
    lines = lines_of(name)
    assert lines <= HARD_MAX_LINES, f"{SIZED[name]} has {lines} lines; split it by concern"
    assert lines <= SOFT_MAX_LINES or name in LONGER, (
        f"{SIZED[name]} has {lines} lines: split it by concern, or list it in LONGER "
        f"({__file__}) with the reason it is one concern")


def test_the_longer_list_is_current():
    stale = [name for name in LONGER if name not in SIZED or lines_of(name) <= SOFT_MAX_LINES]
    assert not stale, f"listed in LONGER but not modules over {SOFT_MAX_LINES} lines: {stale}"


def test_the_checks_see_what_they_look_for():
    """On a doctored graph: a building block importing a model is an upward import, and a model
    and a block importing each other is a cycle (through a function-level import too)."""
    graph = {name: set(deps) for name, deps in GRAPH.items()}
    graph["pygpt.nn.block"].add("pygpt.models.gpt")
    assert upward_imports("pygpt.nn.block", graph) == ["pygpt.models.gpt"]
    cycle = find_cycle(graph)
    assert "pygpt.nn.block" in cycle and "pygpt.models.gpt" in cycle, cycle
    # pygpt.load imports the checkpoint module inside the function: still an edge.
    assert "pygpt.storage.checkpoint" in GRAPH["pygpt"]


# --- the registry is the only list of ops ---------------------------------------------------

RAW_OPS = {raw for op in OPS for raw in op.raw_ops}  # torch.ops.pygpt.<raw>
REGISTRY = PACKAGE / "ops" / "registry.py"
CI_SCRIPT = REPO / ".ci" / "run"


def op_lists_in_python(source: str) -> list[int]:
    """The lines of the literal lists, tuples, sets and dicts (by their keys) in Python source
    that name two or more raw ops."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        else:
            continue
        named = {item.value for item in items
                 if isinstance(item, ast.Constant) and isinstance(item.value, str)}
        if len(named & RAW_OPS) >= 2:
            lines.append(node.lineno)
    return lines


def op_lists_in_shell(text: str) -> list[int]:
    """The lines of the bracketed or parenthesised lists in a shell script (its embedded Python
    included) that name two or more raw ops, quoted or not."""
    return [text.count("\n", 0, m.start()) + 1 for m in re.finditer(r"[\[(][^\])]*[\])]", text)
            if len(set(re.findall(r"\w+", m.group())) & RAW_OPS) >= 2]


def test_the_registry_is_the_only_list_of_ops():
    sources = [p for root in (PACKAGE, REPO / "tests") for p in sorted(root.rglob("*.py"))
               if p != REGISTRY]
    found = [f"{p.relative_to(REPO)}:{line}" for p in sources
             for line in op_lists_in_python(p.read_text(encoding="utf-8"))]
    found += [f"{CI_SCRIPT.relative_to(REPO)}:{line}"
              for line in op_lists_in_shell(CI_SCRIPT.read_text(encoding="utf-8"))]
    assert not found, ("lists of ops outside pygpt/ops/registry.py (read the registry's OPS "
                       f"instead): {', '.join(found)}")


def test_the_op_list_check_sees_what_it_looks_for():
    """On doctored sources: a tuple, a dict and a multi-line shell list naming two raw ops are
    found; a single name, and names that are no op's, are not."""
    python = ('CUDA_OPS = ("attention",\n            "layer_norm_backward")\n'
              'ONE = ["rotary"]\nOTHER = ["attention_mask", "rotary_dim"]\n'
              'SLOTS = {"bias_gelu": 1, "add_layer_norm": 2}\n')
    assert op_lists_in_python(python) == [1, 5]
    shell = "x = ['attention']\npython -c \"\nops = ['rotary',\n       'cross_entropy']\""
    assert op_lists_in_shell(shell) == [3]
    assert op_lists_in_shell(CI_SCRIPT.read_text(encoding="utf-8").replace(
        "ops = [raw for op in OPS", "ops = ['attention', 'layer_norm'] or [raw for op in OPS"))
