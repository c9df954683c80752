"""Pictures of training runs: `python -m pygpt.plot RUN [RUN ...]` draws the train and val loss
that `python -m pygpt.train` logged in each run's metrics.jsonl, against optimizer steps and
against tokens seen, several runs overlaid in one PNG; and, when a run logged it (a translator's
val_bleu), the validation BLEU against steps in a third panel. Entries that are not numbers are
left out.

Why both axes: runs with different batch sizes, context lengths or gradient accumulation take
different numbers of tokens per step, so only the tokens panel compares them fairly; the steps
panel lines up with the learning-rate schedule and the checkpoints.

The figure is built with matplotlib's object-oriented API (Figure + the Agg canvas), never
pyplot: importing or calling this module leaves the user's backend and pyplot's figure list
alone, and works without a display. The PNG is written atomically (pygpt.storage.atomic.atomic_write).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter

from pygpt.storage.atomic import atomic_write
from pygpt_runtime.json_file import parse_json
from pygpt.storage.run_files import LOSS_PLOT, METRICS

FIGSIZE = (11.0, 4.8)  # inches
DPI = 120  # so the PNG is 1320 x 576 pixels

PathLike = Union[str, Path]


def read_metrics(run_dir: PathLike) -> list[dict[str, Any]]:
    """The records of run_dir/metrics.jsonl (blank lines skipped). Raises FileNotFoundError if
    the file is missing, ValueError naming the file and line if it is empty or a line is not a
    JSON object with a numeric "step"."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        what = "no such folder" if not Path(run_dir).is_dir() else f"no {METRICS} in it"
        raise FileNotFoundError(f"run folder {run_dir}: {what} (expected the --out folder of "
                                f"python -m pygpt.train, holding {METRICS})")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path}, line {number}")
        if not isinstance(record, dict) or not _is_number(record.get("step")):
            raise ValueError(f"{path}, line {number}: expected a JSON object with a numeric "
                             "\"step\"")
        records.append(record)
    if not records:
        raise ValueError(f"{path}, line 1: no records (the run has not evaluated yet?)")
    if not any(_is_number(r.get(k)) for r in records for k in ("train_loss", "val_loss")):
        raise ValueError(f"{path}, lines 1-{number}: no record has a train_loss or val_loss")
    return records


def plot_runs(run_dirs: Sequence[PathLike], out_path: PathLike,
              labels: Optional[Sequence[str]] = None) -> Path:
    """Draws the runs' train (dashed) and val (solid) loss against steps and against tokens,
    one colour per run, into the PNG out_path (written atomically; parent folders created).
    Labels default to the folder names, lengthened to parent/name where two coincide."""
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("no runs to plot")
    if labels is None:
        labels = _unique_labels(run_dirs)
    elif len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [read_metrics(d) for d in run_dirs]
    bleu = any(_is_number(r.get("val_bleu")) for records in runs for r in records)

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    FigureCanvasAgg(fig)
    by_step, by_tokens, *by_bleu = fig.subplots(1, 3 if bleu else 2)
    by_tokens.sharey(by_step)
    colours = _colours()
    for i, (records, label) in enumerate(zip(runs, labels)):
        colour = colours[i % len(colours)]
        lines = [(by_step, "step", "train_loss", "--"), (by_step, "step", "val_loss", "-"),
                 (by_tokens, "tokens", "train_loss", "--"), (by_tokens, "tokens", "val_loss", "-")]
        for ax, x_key, y_key, style in lines + [(ax, "step", "val_bleu", "-") for ax in by_bleu]:
            xs, ys = _series(records, x_key, y_key)
            ax.plot(xs, ys, linestyle=style, color=colour, marker="o", markersize=2.5,
                    linewidth=1.5)
    by_step.set(xlabel="optimizer step", ylabel="loss (cross-entropy, nats/token)",
                title="by optimizer step")
    by_tokens.set(xlabel="tokens seen", title="by tokens seen")
    by_tokens.xaxis.set_major_formatter(EngFormatter())
    by_tokens.yaxis.set_tick_params(labelleft=True)
    for ax in by_bleu:
        ax.set(xlabel="optimizer step", ylabel="BLEU", title="validation BLEU (greedy)")
    for ax in (by_step, by_tokens, *by_bleu):
        ax.grid(True, alpha=0.35)
    fig.suptitle(f"{labels[0]}: training loss" if len(runs) == 1
                 else f"training loss of {len(runs)} runs")
    handles = [Line2D([], [], color=colours[i % len(colours)], linewidth=2, label=label)
               for i, label in enumerate(labels)]
    handles += [Line2D([], [], color="0.3", linestyle="--", label="train"),
                Line2D([], [], color="0.3", linestyle="-", label="val")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6),
               frameon=False)

    return write_png(fig, out_path, DPI)


def write_png(fig: Figure, out_path: Union[str, Path], dpi: int) -> Path:
    """Writes the figure as a PNG at out_path, atomically (its folder made if need be), and
    clears it; returns the path."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(out_path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
    finally:
        fig.clear()
    return out_path


def _series(records: list[dict[str, Any]], x_key: str, y_key: str) -> tuple[list, list]:
    """The (x, y) points where both are present; non-finite losses become gaps (NaN)."""
    xs, ys = [], []
    for r in records:
        x, y = r.get(x_key), r.get(y_key)
        if _is_number(x) and _is_number(y):
            xs.append(x)
            ys.append(y if math.isfinite(y) else math.nan)
    return xs, ys


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _colours() -> list[str]:
    return matplotlib.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]


def _unique_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Folder names; where two coincide, those grow to parent/name (and so on) until they differ."""
    parts = [d.resolve().parts for d in run_dirs]
    depth = [1] * len(parts)
    while True:
        labels = [Path(*p[-k:]).as_posix() for p, k in zip(parts, depth)]
        clashing = [i for i, label in enumerate(labels)  # with a different folder
                    if any(label == other and parts[i] != parts[j]
                           for j, other in enumerate(labels))]
        if not clashing:
            break
        for i in clashing:
            depth[i] += 1
    if len(set(labels)) < len(labels):  # the same folder given twice: number the repeats
        labels = [f"{label} ({i + 1})" for i, label in enumerate(labels)]
    return labels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pygpt.plot",
        description="Plot the train (dashed) and val (solid) loss of training runs against "
                    "optimizer steps and against tokens seen, from each run's metrics.jsonl.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run folders (the --out folders of python -m pygpt.train)")
    parser.add_argument("--out", metavar="FILE",
                        help="PNG to write (default: RUN/loss.png for one run, runs.png in the "
                             "current folder for several)")
    parser.add_argument("--labels", nargs="+", metavar="LABEL",
                        help="legend labels, one per run, given after the runs (default: the "
                             "folder names, made unique with their parents)")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    out = args.out or (Path(args.runs[0]) / LOSS_PLOT if len(args.runs) == 1 else "runs.png")
    try:
        written = plot_runs(args.runs, out, labels=args.labels)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    print(written)


if __name__ == "__main__":
    main()
