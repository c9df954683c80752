"""The run's metrics.jsonl: one JSON record of numbers per evaluation, appended as the run
goes, and cut back to a checkpoint's step when a run resumes (records past it, left by a run
killed after its last save, and any half-written line are dropped)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from pygpt.storage.atomic import atomic_write_text
from pygpt.storage.run_files import METRICS
from pygpt_runtime.json_file import parse_json


def append_metrics(out: Path, record: dict[str, Any]) -> None:
    """Appends one record (a line of JSON) to out/metrics.jsonl, after the checkpoint of its
    step was saved: an OSError the OS gives (no space left, a read-only disk) says that
    checkpoint is intact (a resume drops the half-written line, as for a killed run)."""
    try:
        with open(out / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise OSError(e.errno, f"cannot append to {METRICS} ({e.strerror or e}); the checkpoint "
                      f"of step {record['step']} is saved and intact", str(out)) from None


def _record_step(line: str) -> Optional[int]:
    """The step of one line of metrics.jsonl; None for a line that is not a whole record (one
    half-written when a run was killed mid-append)."""
    try:
        record = parse_json(line, METRICS)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


def truncate_metrics(out: Path, step: int) -> None:
    """Drops records past `step`, left by a run that was killed after its last checkpoint, and
    any line that is not a whole record."""
    path = out / METRICS
    if path.exists():
        lines = [(l, _record_step(l)) for l in
                 path.read_text(encoding="utf-8", errors="replace").splitlines() if l.strip()]
        kept = [l for l, s in lines if s is not None and s <= step]
        dropped = sum(s is None for _, s in lines)
        if dropped:
            print(f"warning: {path}: dropped {dropped} damaged line(s)", file=sys.stderr)
        atomic_write_text(path, "".join(l + "\n" for l in kept))
