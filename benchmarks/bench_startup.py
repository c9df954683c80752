#!/usr/bin/env python
"""Whole-process generation: `python -m pygpt.generate` against the torch-free ONNX runner
(pygpt-run) on the same model, `--new-tokens` greedy tokens (default 2,000), one thread,
the two commands alternated `--repeat` times; and `python -c "import torch"`, what importing torch
and the interpreter's exit with it cost (pygpt.generate skips that exit's teardown). Prints each
command's median wall time (start to exit) and whether the two generators printed the same text.

The model: a checkpoint (`--ckpt`, exported to ONNX into a temporary folder unless `--onnx`
names an export of it) or, by default, the `baby` preset's shape with random weights and a
character vocabulary (saved and exported into a temporary folder). The prompt defaults to the
first token of the vocabulary.

Usage:
  python benchmarks/bench_startup.py
  python benchmarks/bench_startup.py --ckpt out/ --prompt "ROMEO:" --repeat 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from machine import busy_warning, cpu_model
from pygpt.storage import checkpoint
from pygpt.export import export
from pygpt.models import GPT
from pygpt.config.presets import preset
from pygpt.tokenizer import CharTokenizer

RUNNER = [sys.executable, "-m", "pygpt_runtime"]  # the pygpt-run command


def random_checkpoint(folder: Path, preset_name: str) -> Path:
    cfg = preset(preset_name).model
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tokenizer = CharTokenizer([chr(0x100 + i) for i in range(cfg.vocab_size)])
    checkpoint.save(folder / "ckpt", model, tokenizer)
    return folder / "ckpt"


def timed(command: list[str]) -> tuple[float, str]:
    """Wall time of the whole process and what it printed (an error if it failed)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"error: {command[:3]} failed ({done.returncode}): {done.stderr[-500:]}")
    return seconds, done.stdout


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default=None, help="a trained checkpoint (default: random weights)")
    p.add_argument("--onnx", default=None, help="an export of --ckpt (default: export it now)")
    p.add_argument("--preset", default="baby", help="the shape without --ckpt (default: baby)")
    p.add_argument("--prompt", default=None, help="default: the vocabulary's first token")
    p.add_argument("--new-tokens", type=int, default=2000, help="greedy tokens (default 2000)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each command (median)")
    args = p.parse_args(argv)
    if args.new_tokens < 1 or args.repeat < 1:
        p.error("--new-tokens and --repeat must be >= 1")
    if args.onnx and not args.ckpt:
        p.error("--onnx needs the --ckpt it was exported from")
    print(f"# whole processes, {args.new_tokens} greedy tokens, 1 thread, median of {args.repeat}")
    print(f"# CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}")
    busy_warning([1])
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as work:
        ckpt = Path(args.ckpt) if args.ckpt else random_checkpoint(Path(work), args.preset)
        onnx = Path(args.onnx) if args.onnx else Path(work) / "onnx"
        if not args.onnx:
            export(ckpt, onnx)
        _, tokenizer = checkpoint.load(ckpt)
        prompt = args.prompt if args.prompt is not None else tokenizer.decode([0])
        common = ["--prompt", prompt, "--greedy", "--max-new-tokens", str(args.new_tokens),
                  "--threads", "1"]
        commands = {
            "python -m pygpt.generate": [sys.executable, "-m", "pygpt.generate", "--ckpt",
                                         str(ckpt), *common],
            "pygpt-run": [*RUNNER, "--model", str(onnx), *common],
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
        }
        times = {name: [] for name in commands}
        texts = {}
        for r in range(args.repeat):
            for name in (list(commands) if r % 2 == 0 else list(reversed(commands))):
                seconds, text = timed(commands[name])
                times[name].append(seconds)
                texts.setdefault(name, text)
    for name, ts in times.items():
        print(f"{name:>26}: {statistics.median(ts):6.2f} s  (runs: "
              + ", ".join(f"{t:.2f}" for t in ts) + ")")
    same = texts["python -m pygpt.generate"] == texts["pygpt-run"]
    print(f"# identical text: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
