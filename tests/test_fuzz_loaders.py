"""Structure-aware fuzzing of the loaders of every file a run or an export folder holds: each
starts from a valid file, has hypothesis mutate its JSON (a value replaced by another of any type,
huge, negative, a path outside the folder, a control character; a key dropped or added) and then
maybe its bytes (cut short, bytes inserted), and checks the loader ends in a loaded object or a
one-line ValueError / FileNotFoundError: never another exception, nor a write outside its folder,
nor a large allocation."""
import json
import resource
import shutil

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from pygpt.storage import checkpoint  # noqa: E402
from pygpt.config import ModelConfig  # noqa: E402
from pygpt.config.fields import to_dict  # noqa: E402
from pygpt.storage.atomic import recover_folder  # noqa: E402
from pygpt.models import GPT  # noqa: E402
from pygpt.tokenizer import (BPETokenizer, CharTokenizer, WordPieceTokenizer,  # noqa: E402
                             load_tokenizer)
from pygpt_runtime.runner_config import read_config as read_runner_config  # noqa: E402

TEXT = "the cat sat on the mat. the dog ate the bone.\n" * 20
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, -1, 1, 2 ** 31]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["../x", "/etc/passwd", "..", ".", "a/b", "\x1b[2J",
                                           "COMMITTED", ".staging-1", "model.onnx", "fp32"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@st.composite
def mutated(draw, value):
    """value with one to three structure-aware mutations."""
    for _ in range(draw(st.integers(1, 3))):
        value = _mutate_once(draw, value)
    return value


def _mutate_once(draw, value):
    if isinstance(value, (dict, list)) and value and draw(st.booleans()):
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        key = draw(st.sampled_from(keys))
        copy = dict(value) if isinstance(value, dict) else list(value)
        action = draw(st.sampled_from(["into", "drop", "add"]))
        if action == "into":
            copy[key] = _mutate_once(draw, copy[key])
        elif action == "drop":
            del copy[key]
        elif isinstance(copy, dict):
            copy[draw(st.text(max_size=8))] = draw(VALUES)
        else:
            copy.append(draw(VALUES))
        return copy
    return draw(VALUES)


@st.composite
def file_bytes(draw, seed):
    """The bytes of a mutated seed: its JSON, maybe cut short or with bytes inserted."""
    data = json.dumps(draw(mutated(seed)) if draw(st.integers(0, 9)) else seed).encode()
    action = draw(st.sampled_from(["none", "none", "cut", "insert"]))
    if action == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif action == "insert":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return data


def fuzz(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def ends_cleanly(load, root, case):
    """load() returns, or raises a one-line ValueError or FileNotFoundError; nothing outside case
    (a folder under root) changes."""
    before = sorted(p for p in root.rglob("*") if case not in p.parents and p != case)
    try:
        load()
    except (ValueError, FileNotFoundError) as e:
        assert "\n" not in str(e) and str(e), repr(e)
    after = sorted(p for p in root.rglob("*") if case not in p.parents and p != case)
    assert before == after


# Each case may grow the process's address space by at most this much: an allocation sized from
# a file (a vocabulary of 2^40, a context of 10^9) fails at once inside the case that asks for it,
# as a MemoryError or torch's RuntimeError, which ends_cleanly reports as a failure.
CASE_MEMORY = 1 << 30


def _address_space() -> int:
    """The bytes of this process's address space now (VmSize)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


@pytest.fixture(autouse=True)
def bounded_memory():
    """Every test here runs under an address-space limit of what the process holds now plus
    CASE_MEMORY (the soft limit, raised back afterwards)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + CASE_MEMORY
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip(f"the address-space limit {hard} leaves no room to bound the cases")
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_the_memory_bound_is_in_force():
    with pytest.raises(MemoryError):
        bytearray(2 * CASE_MEMORY)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny GPT checkpoint (config.json, weights, tokenizer) to copy and damage."""
    folder = tmp_path_factory.mktemp("fuzz") / "ckpt"
    tokenizer = CharTokenizer.from_text(TEXT)
    model = GPT(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8,
                            vocab_size=tokenizer.vocab_size), kernels="torch")
    checkpoint.save(folder, model, tokenizer)
    return folder


def _case(root, template=None):
    case = root / "case"
    shutil.rmtree(case, ignore_errors=True)
    if template is not None:
        shutil.copytree(template, case)
    else:
        case.mkdir()
    (root / "outside").mkdir(exist_ok=True)
    return case


def test_config_json(saved):
    seed = json.loads((saved / "config.json").read_text())

    @fuzz(250)
    @given(file_bytes(seed))
    def check(data):
        case = _case(saved.parent, saved)
        (case / "config.json").write_bytes(data)
        ends_cleanly(lambda: (checkpoint.read_config(case),
                              checkpoint.load(case, kernels="torch")), saved.parent, case)
    check()


def test_labels_json(tmp_path):
    config = {"format": 3, "step": 0, "model": {**to_dict(ModelConfig()), "num_labels": 3}}

    @fuzz(500)
    @given(file_bytes(["neg", "neutral", "pos"]), st.booleans())
    def check(data, damage_config):
        case = _case(tmp_path)
        (case / "config.json").write_text(json.dumps(config))
        (case / "labels.json").write_bytes(data)
        if damage_config:
            (case / "config.json").write_text(json.dumps(
                {**config, "model": {**config["model"], "num_labels": 2 ** 40}}))
        ends_cleanly(lambda: checkpoint.load_labels(case), tmp_path, case)
    check()


@pytest.mark.parametrize("family", ["gpt", "seq2seq"])
def test_runner_json(tmp_path, family):
    seed = {"format": 1, "family": family, "task": "generate", "block_size": 8, "opset": 18,
            "tokenizer": {"kind": "char", "file": "tokenizer.json"}, "special_tokens": {},
            **({"models": {"fp32": "model.onnx", "int8": "model.int8.onnx"}, "n_head": 2,
                "head_dim": 8, "window_keep": 4, "inputs": ["idx"]} if family == "gpt" else
               {"models": {"fp32": {p: f"{p}.onnx" for p in
                                    ("encoder", "decoder", "decoder_with_past")}},
                "io": {p: [["a"], ["b"]] for p in ("encoder", "decoder", "decoder_with_past")}})}

    @fuzz(400)
    @given(file_bytes(seed))
    def check(data):
        case = _case(tmp_path)
        (case / "runner.json").write_bytes(data)
        ends_cleanly(lambda: read_runner_config(case), tmp_path, case)
    check()


@pytest.mark.parametrize("kind", ["char", "bpe", "wordpiece"])
def test_tokenizer_json(tmp_path, kind):
    tokenizer = {"char": lambda: CharTokenizer.from_text(TEXT, specials=True),
                 "bpe": lambda: BPETokenizer.train(TEXT, 300),
                 "wordpiece": lambda: WordPieceTokenizer.train(TEXT, 60)}[kind]()
    seed = json.loads(tokenizer.to_json())

    @fuzz(250)
    @given(file_bytes(seed))
    def check(data):
        case = _case(tmp_path)
        (case / "tokenizer.json").write_bytes(data)
        ends_cleanly(lambda: load_tokenizer(case / "tokenizer.json"), tmp_path, case)
    check()


def test_commit_marker(tmp_path):
    seed = {"written": ["config.json", "model.safetensors"], "remove": ["train_state.pt"],
            "index": "config.json", "time_ns": 1}

    @fuzz(400)
    @given(file_bytes(seed))
    def check(data):
        case = _case(tmp_path)
        staging = case / ".staging-1"
        staging.mkdir()
        for name in ("config.json", "model.safetensors"):
            (staging / name).write_text("new")
        (case / "train_state.pt").write_text("old")
        (staging / "COMMITTED").write_bytes(data)
        ends_cleanly(lambda: recover_folder(case), tmp_path, case)
    check()



# What Python's json cannot take: values nested past its recursion limit, and an integer of more
# digits than Python converts from text (a ValueError naming no file, were it not caught).
HUGE = "1" * 5000
DEEP = ['{"a":' * 100000 + "1" + "}" * 100000, "[" * 100000 + "]" * 100000]


def _unparsable(seed):
    """Texts of seed's kind that json cannot read: deep nesting, a huge integer inside it."""
    text, key = json.dumps(seed), "" if isinstance(seed, list) else '"n": '
    return [*DEEP, f"{text[:-1]}, {key}{HUGE}{text[-1]}"]


def _hf_case(case, name, text):
    """An HF folder (config.json, empty weights, GPT-2's tokenizer files, a tokenizer config)
    with text as its file name; its config and tokenizer read."""
    from pygpt.hf import folder as hf_folder, tokenizer_files

    files = {"config.json": "{}", "model.safetensors": "", "vocab.json": '{"a": 0, "b": 1}',
             "merges.txt": "#version: 0.2\na b\n", "tokenizer_config.json": "{}"}
    for n, content in {**files, name: text}.items():
        (case / n).write_text(content)
    return lambda: (hf_folder.read_config(case),
                    tokenizer_files.read_tokenizer(case, "gpt2", 3))


def _loaders(saved):
    """name -> (the file's seed value, setup(case, text) -> load), for each file read as JSON."""
    config = {"format": 3, "step": 0, "model": {**to_dict(ModelConfig()), "num_labels": 3}}

    def checkpoint_file(name):
        def setup(case, text):
            shutil.copytree(saved, case, dirs_exist_ok=True)
            (case / name).write_text(text)
            return lambda: checkpoint.load(case, kernels="torch")
        return setup

    def labels(case, text):
        (case / "config.json").write_text(json.dumps(config))
        (case / "labels.json").write_text(text)
        return lambda: checkpoint.load_labels(case)

    def runner(case, text):
        (case / "runner.json").write_text(text)
        return lambda: read_runner_config(case)

    def marker(case, text):
        (case / ".staging-1").mkdir()
        (case / ".staging-1" / "COMMITTED").write_text(text)
        return lambda: recover_folder(case)

    def export_tokenizer(case, text):
        from pygpt_runtime.text import load_tokenizer as load_export_tokenizer

        (case / "tokenizer.json").write_text(text)
        return lambda: load_export_tokenizer(case / "tokenizer.json", "char")

    seeds = {name: json.loads((saved / name).read_text()) for name in ("config.json",
                                                                       "tokenizer.json")}
    return {"config.json": (seeds["config.json"], checkpoint_file("config.json")),
            "tokenizer.json": (seeds["tokenizer.json"], checkpoint_file("tokenizer.json")),
            "labels.json": (["neg", "neutral", "pos"], labels),
            "runner.json": ({"family": "gpt", "block_size": 8}, runner),
            "COMMITTED": ({"written": [], "remove": [], "time_ns": 1}, marker),
            "export tokenizer.json": (seeds["tokenizer.json"], export_tokenizer),
            **{f"HF {name}": ({"a": 0}, lambda case, text, name=name: _hf_case(case, name, text))
               for name in ("config.json", "vocab.json", "tokenizer.json",
                            "tokenizer_config.json")}}


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "labels.json", "runner.json",
                                  "COMMITTED", "export tokenizer.json", "HF config.json",
                                  "HF vocab.json", "HF tokenizer.json",
                                  "HF tokenizer_config.json"])
def test_deep_nesting_and_huge_integers_are_one_line(saved, tmp_path, name):
    """Each loader refuses JSON nested past Python's recursion limit, or holding an integer of
    more digits than Python converts, with one line naming the file."""
    seed, setup = _loaders(saved)[name]
    for text in _unparsable(seed):
        case = _case(tmp_path)
        load = setup(case, text)
        with pytest.raises(ValueError) as error:
            load()
        message = str(error.value)
        assert "\n" not in message and name.split()[-1] in message, message
