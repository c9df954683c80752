"""A model opened for serving (Served): built by open_export here from an export folder, with
the runner of its family, or by pygpt.serve.checkpoint.open_checkpoint from a checkpoint, with
pygpt's torch model; either way its family's entry in the table (pygpt_runtime.families) gives
its routes, and the holder gives them the model, its tokenizer, its worker and the limits.
Limits: the server's bounds (its command's flags)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from fastapi import APIRouter

from pygpt_runtime.cli_checks import utf8_text
from pygpt_runtime.families import FAMILIES, load
from pygpt_runtime.runner_config import read_family
from pygpt_runtime.serve.batcher import Batcher
from pygpt_runtime.serve.errors import RequestError
from pygpt_runtime.serve.tasks import TaskQueue


@dataclass
class Limits:
    queue_size: int = 64  # rows (gpt) or requests waiting; more: 503
    max_batch: int = 32  # rows decoded together; prompts or sentences a request
    max_tokens: int = 2048  # max_tokens a completion may ask
    max_text_tokens: int = 4096  # tokens of a prompt or text
    max_body_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


class Served:
    """A model being served: `name`, what requests and /health call it (its folder's name);
    `family`, its entry in the table; `task` and `labels`, from its runner.json (or what a
    checkpoint's server says in its place: `config`); `model`, what its task's routes call;
    `worker`, that runs them (a decode worker's submit, a TaskQueue's run; both give their
    health and close); and parts attached besides (a checkpoint's attention maps)."""

    def __init__(self, folder: str, config: dict, model: Any, tokenizer: Any, worker: Any,
                 limits: Limits):
        self.name = Path(folder).resolve().name
        self.family = FAMILIES[config["family"]]
        self.task, self.labels = config["task"], config.get("labels")
        self.model, self.tokenizer, self.worker, self.limits = model, tokenizer, worker, limits
        self.created = int(time.time())
        self.parts: dict[str, tuple[Callable[[], dict], APIRouter]] = {}

    def attach(self, name: str, describe: Callable[[], dict], routes: APIRouter) -> None:
        """Adds a part: its routes, and describe() under name in /health."""
        self.parts[name] = (describe, routes)

    def encode(self, text: str, field: str, parse_specials: bool = False) -> list[int]:
        """text's token ids; a 400 naming field for text that is not UTF-8, that the tokenizer
        cannot take (a character not in a char model's vocabulary) or that is too long."""
        try:
            ids = self.tokenizer.encode(utf8_text(text, field), parse_specials)
        except ValueError as e:
            raise RequestError(400, field, f"{field}: {e}") from None
        if len(ids) > self.limits.max_text_tokens:
            raise RequestError(400, field, f"{field} is {len(ids)} tokens; the server takes at "
                                           f"most {self.limits.max_text_tokens}")
        return ids

    def summary(self) -> str:
        """What is served, in words: "onnx, a gpt model (generate)"."""
        return f"{self.name}, a {self.family.name} model ({self.task})"

    def health(self) -> dict:
        """What GET /health answers: status "ok", or "failed" when the worker has failed (its
        "failure" says why; the route answers 503 then)."""
        worker = self.worker.health()
        return {"status": "failed" if "failure" in worker else "ok", "model": self.name,
                "family": self.family.name, "task": self.task,
                **({"labels": self.labels} if self.labels is not None else {}), **worker,
                **{name: describe() for name, (describe, _) in self.parts.items()}}

    def routers(self) -> list[APIRouter]:
        """The routes of the served task, then those of the attached parts."""
        return [load(self.family.tasks[self.task].routes)(self),
                *(routes for _, routes in self.parts.values())]

    def close(self) -> None:
        self.worker.close()


# An export's worker, by the kind its family's entry names.
WORKERS: dict[str, Callable[[Any, Limits], Any]] = {
    "rows": lambda model, limits: Batcher(model, limits.queue_size, limits.max_batch),
    "requests": lambda model, limits: TaskQueue(limits.queue_size)}


def open_export(folder: str, limits: Limits, variant: str = "fp32",
                threads: Optional[int] = None) -> Served:
    """An export folder served by the runner of its family (one-line errors for a missing or
    damaged export, as pygpt-run's)."""
    family = FAMILIES[read_family(Path(folder))]
    model = load(family.runner)(folder, variant, threads)
    return Served(folder, model.config, model, model.tokenizer,
                  WORKERS[family.worker](model, limits), limits)
