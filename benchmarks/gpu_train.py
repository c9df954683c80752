#!/usr/bin/env python
"""Trains the `shakespeare` preset on the GPU with our kernels and with plain PyTorch
(`--kernels torch`) from the same seed, each as a user runs it (one `python -m pygpt.train`
process), and checks that the two runs' evaluated losses agree: the training step of
benchmarks/gpu_check.sh.

Both runs draw the same batches and dropout masks (same seed, same calls), so the two sets of
kernels differ only in rounding; that drifts the weights apart slowly, so the losses may differ
by a little and more with every step: --tolerance (default 0.02, about 1% of the losses at
these steps) bounds the difference at every evaluation. A wrong kernel shows in the first one.
Writes a markdown table of both runs' train and validation losses at each evaluation and the
tokens/s each trained at (metrics.jsonl's, evaluations excluded); exits 1 if a run failed or the
losses differ by more than the tolerance.

Usage:
  python benchmarks/gpu_train.py --work /tmp/runs --table train.md            # GPU, 300 steps
  python benchmarks/gpu_train.py --work /tmp/runs --table train.md --dry-run  # CPU, tiny
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

KERNEL_SETS = ("ext", "torch")
# float32 (a CUDA run's default is bfloat16 autocast): the kernels are compared in the type whose
# rounding drift the tolerance was set for.
RUN = ["--preset", "shakespeare", "--quiet", "--seed", "1337", "--dtype", "float32"]
GPU = ["--device", "cuda", "--warmup-iters", "30", "--eval-interval", "50", "--eval-iters", "10"]
DRY = ["--device", "cpu", "--warmup-iters", "0", "--eval-interval", "2", "--eval-iters", "1",
       "--batch-size", "4", "--block-size", "32", "--n-layer", "1", "--n-head", "2",
       "--n-embd", "32", "--threads", "1"]


def train(kernels: str, steps: int, out: Path, dry: bool) -> tuple:
    """(exit status, wall seconds, metrics rows) of one run."""
    cmd = [sys.executable, "-m", "pygpt.train", *RUN, *(DRY if dry else GPU),
           "--max-iters", str(steps), "--kernels", kernels, "--out", str(out)]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    status = subprocess.run(cmd).returncode
    wall = time.perf_counter() - t0
    metrics = out / "metrics.jsonl"
    rows = ([json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
            if metrics.exists() else [])
    return status, wall, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="folder for the two run folders")
    p.add_argument("--table", type=Path, required=True, help="markdown table to write")
    p.add_argument("--steps", type=int, default=None, help="default: 300 (4 with --dry-run)")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="largest difference of an evaluated loss between the two runs")
    p.add_argument("--dry-run", action="store_true", help="a tiny model, a few steps, on the CPU")
    args = p.parse_args()
    steps = args.steps or (4 if args.dry_run else 300)
    runs = {k: train(k, steps, args.work / f"train-{k}", args.dry_run) for k in KERNEL_SETS}

    lines = [f"`shakespeare` preset, {steps} steps, seed 1337, "
             f"{'CPU, tiny (dry run)' if args.dry_run else 'GPU'}; `ext`: our kernels, "
             "`torch`: plain PyTorch.", "",
             "| step | ext train loss | torch train loss | ext val loss | torch val loss | "
             "largest difference |", "|--:|--:|--:|--:|--:|--:|"]
    ext, ref = (runs[k][2] for k in KERNEL_SETS)
    worst = 0.0
    for a, b in zip(ext, ref):
        diff = max(abs(a[f"{s}_loss"] - b[f"{s}_loss"]) for s in ("train", "val"))
        worst = max(worst, diff)
        lines.append(f"| {a['step']} | {a['train_loss']:.4f} | {b['train_loss']:.4f} | "
                     f"{a['val_loss']:.4f} | {b['val_loss']:.4f} | {diff:.2e} |")
    lines += ["", "| kernels | exit status | tokens/s (last interval) | wall s |",
              "|---|--:|--:|--:|"]
    for k, (status, wall, rows) in runs.items():
        speed = f"{rows[-1]['tokens_per_s']:,.0f}" if rows else "-"
        lines.append(f"| {k} | {status} | {speed} | {wall:.1f} |")
    failed = [k for k, (status, _, rows) in runs.items() if status != 0 or not rows]
    complete = len(ext) == len(ref) and ext and ext[-1]["step"] == steps
    if failed:
        verdict = f"FAILED: the {' and '.join(failed)} run failed (see the log)."
    elif not complete:
        verdict = f"FAILED: the runs did not both reach step {steps}."
    elif worst > args.tolerance:
        verdict = f"Losses DIFFER: by up to {worst:.2e}, past the tolerance {args.tolerance}."
    else:
        verdict = f"Losses agree: by up to {worst:.2e}, within the tolerance {args.tolerance}."
    args.table.write_text("\n".join([verdict, ""] + lines) + "\n", encoding="utf-8")
    print(verdict)
    raise SystemExit(0 if verdict.startswith("Losses agree") else 1)


if __name__ == "__main__":
    main()
