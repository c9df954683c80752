#!/usr/bin/env python
"""Writes OUTDIR/report.md for benchmarks/gpu_check.sh from what its steps left: the machine's
facts (env.json), each step's result and time (steps.tsv), the build's first compiler errors,
the attention kernels' registers, spills and tensor-core instructions (sass.md), the pytest and
ctest summaries and failures, the benchmark table (bench.md), the training comparison (train.md)
and GPT-2 small's training speeds (gpt2.md). The logs stay beside it in OUTDIR; the other files are in WORKDIR.

Usage: python benchmarks/gpu_report.py --out OUTDIR --work WORKDIR [--dry-run]
"""
import argparse
import json
import re
from pathlib import Path

SECTIONS = ("Device", "Steps", "Build", "Machine code", "Tests", "Benchmarks", "Training",
            "GPT-2 small")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def steps(work: Path) -> dict:
    """{step: (result, seconds)} in the order the steps ran."""
    rows = [line.split("\t") for line in read(work / "steps.tsv").splitlines() if line]
    return {name: (result, seconds) for name, result, seconds in rows}


def device(work: Path) -> list:
    facts = json.loads(read(work / "env.json") or "{}")
    if not facts:
        return ["The machine's facts were not gathered (see the env step)."]
    names = {"device": "device", "capability": "compute capability",
             "multiprocessors": "multiprocessors", "memory_gib": "memory (GiB)",
             "driver": "driver", "torch": "torch", "torch_cuda": "torch's CUDA",
             "cudnn": "cuDNN", "nvcc": "nvcc", "cuda_home": "CUDA toolkit", "ninja": "ninja",
             "python": "Python",
             "cpus": "CPUs", "host": "host", "commit": "commit"}
    return [f"- {label}: {facts[key]}" for key, label in names.items() if key in facts]


def build(out: Path, result: str) -> list:
    log = read(out / "build.log")
    if result == "ok":
        registered = [ln for ln in log.splitlines() if "kernels registered" in ln]
        return [f"Built. {registered[-1]}" if registered else "Built."]
    if not result.startswith(("failed", "timed out")):
        return [f"Build: {result}."]
    errors = [ln for ln in log.splitlines()
              if re.search(r"\berror\b|FAILED:", ln, re.IGNORECASE)][:20]
    return [f"Build: {result}. The compiler's first errors (build.log has everything):", "",
            "```", *(errors or log.splitlines()[-20:]), "```"]


def summary(log: str, pattern: str, failures: str) -> list:
    """The last summary line matching pattern and the failure lines, from a test log."""
    if not log:
        return ["not run"]
    lines = log.splitlines()
    found = [ln.strip("= ") for ln in lines if re.search(pattern, ln)]
    failed = [ln for ln in lines if re.match(failures, ln)][:30]
    return ([found[-1]] if found else ["no summary line (see the log)"]) + failed


def tests(out: Path) -> list:
    python = summary(read(out / "tests.log"), r"\d+ (passed|failed|skipped|error)",
                     r"(FAILED|ERROR) ")
    native = summary(read(out / "native.log"), r"tests passed|tests failed", r"\s+\d+ - ")
    return (["tests/test_cuda.py and tests/test_fused_cuda.py (tests.log):", "", "```",
             *python, "```", "", "Native CUDA tests under ctest (native.log):", "", "```",
             *native, "```"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    results = steps(args.work)
    title = "# GPU check" + (" (dry run on the CPU: the numbers mean nothing)" if args.dry_run
                             else "")
    body = {
        "Device": device(args.work),
        "Steps": ["| step | result | seconds |", "|---|---|--:|",
                  *(f"| {name} | {result} | {seconds} |"
                    for name, (result, seconds) in results.items())],
        "Build": build(args.out, results.get("build", ("not run", ""))[0]),
        "Machine code": (read(args.work / "sass.md").splitlines() or
                         [f"No table: the sass step {results.get('sass', ('was not run',))[0]}."]),
        "Tests": tests(args.out),
        "Benchmarks": (read(args.work / "bench.md").splitlines() or
                       [f"No table: the bench step {results.get('bench', ('was not run',))[0]}."]),
        "Training": (read(args.work / "train.md").splitlines() or
                     [f"No table: the train step {results.get('train', ('was not run',))[0]}."]),
        "GPT-2 small": (read(args.work / "gpt2.md").splitlines() or
                        [f"No table: the gpt2 step {results.get('gpt2', ('was not run',))[0]}."]),
    }
    lines = [title, ""]
    for name in SECTIONS:
        lines += [f"## {name}", "", *body[name], ""]
    report = args.out / "report.md"
    partial = report.with_name(".report.md.partial")
    partial.write_text("\n".join(lines), encoding="utf-8")
    partial.replace(report)


if __name__ == "__main__":
    main()
