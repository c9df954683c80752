"""Reading JSON from a file that may come from anyone (torch-free; pygpt reads its own files
through it too). Python's json module fails in three ways a file can cause: a JSONDecodeError
for text that is not JSON, a RecursionError for values nested deeper than its parser recurses
('{"a":' repeated), and a ValueError for an integer of more digits than Python converts from
text (4300 by default). Each becomes one ValueError line naming the file, never a traceback."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_json(text: str, source: str, what: str = "valid JSON") -> Any:
    """The JSON value of text, the content of the file source; otherwise a one-line ValueError
    "{source} is not {what}: {why}"."""
    try:
        return json.loads(text)
    except RecursionError:
        why = "values nested too deeply"
    except ValueError as e:  # JSONDecodeError, or an integer of too many digits
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"{source} is not {what}: {why}")


def read_json(path: Path, what: str = "valid JSON") -> Any:
    """The JSON value in the file path, read as UTF-8 (a FileNotFoundError or other OSError
    passes on); otherwise a one-line ValueError "{path} is not {what}: {why}"."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not {what}: not UTF-8 ({e.reason} at byte {e.start})"
                         ) from None
    return parse_json(text, str(path), what)
