"""benchmarks/gpu_check.sh, the one call a lent GPU machine gets, proven on the CPU: its dry run
goes through every step (the build's op check, the CUDA test files, a native CUDA test on the
host emulator, the benchmark of every op, the training comparison, GPT-2 small's training speeds)
and writes a report with every section, a benchmark row for every op of the registry, the two
runs' losses and a row for each way of training GPT-2; OUTDIR holds only what the device tool
brings back. Out of time or told to skip, steps are recorded as such, the report is still
written and the exit status says so."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pygpt.ops.registry import OPS

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
SECTIONS = ["Device", "Steps", "Build", "Machine code", "Tests", "Benchmarks", "Training",
            "GPT-2 small"]
LOGS = {"report.md", "build.log", "tests.log", "native.log", "bench.log", "train.log",
        "gpt2.log"}

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None,
                                reason="cmake/ctest not installed (the native step needs them)")


def run(*args: str, budget: str = "450") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_BUDGET_S=budget)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def sections(report: str) -> dict:
    """{heading: text} of the report's `## ` sections, in order."""
    parts = re.split(r"^## (.+)$", report, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def step_results(report: str) -> dict:
    return dict(re.findall(r"^\| ([\w-]+) \| ([^|]+?) \| \d+ \|$", sections(report)["Steps"],
                           flags=re.MULTILINE))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "out"
    done = run(str(out), "--dry-run")
    return done, out, (out / "report.md").read_text(encoding="utf-8")


def test_the_dry_run_passes_every_step(dry_run):
    done, _, report = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert step_results(report) == {**{step: "ok" for step in (
        "env", "build", "tests", "native-build", "native-tests", "bench", "train", "gpt2")},
        "sass": "skipped: dry run (the CPU build holds no device code)"}
    assert list(sections(report)) == SECTIONS
    assert done.stdout.rstrip().endswith(report.rstrip())  # the report ends the output


def test_the_report_says_what_each_step_found(dry_run):
    _, _, report = dry_run
    parts = sections(report)
    assert "- torch: " in parts["Device"]
    assert re.search(r"Built\. \d+ ops have CPU kernels registered", parts["Build"])
    assert "No table: the sass step skipped: dry run" in parts["Machine code"]
    assert re.search(r"\d+ skipped", parts["Tests"])  # the CUDA tests, with no GPU here
    assert "100% tests passed, 0 tests failed out of 1" in parts["Tests"]
    assert "Losses agree" in parts["Training"]
    assert re.search(r"^\| 4 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", parts["Training"],
                     flags=re.MULTILINE)
    for model in ("pygpt --kernels ext", "pygpt --kernels torch",
                  "plain PyTorch (SDPA, fused AdamW)", "transformers GPT2LMHeadModel (sdpa)"):
        assert re.search(rf"^\| {re.escape(model)} \| [\d.]+M \| [\d.]+ \| [\d,]+ \|",
                         parts["GPT-2 small"], flags=re.MULTILINE), model


def test_every_op_is_benchmarked_forward_and_backward(dry_run):
    _, _, report = dry_run
    table = sections(report)["Benchmarks"]
    for op in OPS:
        for passes in ("fwd", "fwd+bwd"):
            rows = re.findall(rf"^\| {op.name} \| [^|]+ \| fp32 \| {re.escape(passes)} \| .*$",
                              table, flags=re.MULTILINE)
            timed = [row for row in rows if "n/a" not in row]
            assert timed, f"no timed {passes} row for {op.name}"
            for row in timed:  # ours/baseline, and a rel. err within tolerance
                assert re.search(r"\| \d+\.\d\d \|", row) and "DIFFERS" not in row, row
    assert "Aims:" in table and "Ceilings:" in table


def test_outdir_holds_what_the_device_tool_brings_back(dry_run):
    """At most 8 plain files, named in letters, digits, '.', '_' and '-'."""
    _, out, _ = dry_run
    files = sorted(p.name for p in out.iterdir())
    assert set(files) == LOGS
    assert all(re.fullmatch(r"[\w.-]+", name) and (out / name).is_file() for name in files)


def test_steps_out_of_time_or_skipped_are_recorded(tmp_path):
    done = run(str(tmp_path / "out"), "--dry-run", "--skip", "native,tests", budget="0")
    assert done.returncode == 1
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert list(sections(report)) == SECTIONS
    assert step_results(report) == {
        "env": "not run: out of time", "native": "skipped: --skip",
        "build": "not run: out of time", "tests": "skipped: --skip",
        "bench": "skipped: no extension", "train": "skipped: no extension",
        "gpt2": "skipped: no extension"}
    assert "No table: the bench step skipped: no extension." in report


@pytest.mark.parametrize("args", [[], ["--bogus"], ["a", "b"], ["out", "--skip"]])
def test_bad_arguments_print_the_usage(args):
    done = run(*args)
    assert done.returncode == 2
    assert done.stderr.strip() == ("usage: benchmarks/gpu_check.sh OUTDIR [--dry-run] "
                                   "[--skip STEP,...]")
