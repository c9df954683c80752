"""The server's application: the export it serves (Served: the runner's model of its family, its
worker, the limits) and the FastAPI app over it: the family's routes (completions.py,
tasks.py), GET /health, the playground page at / (the package's playground/ folder: plain
HTML and JavaScript, nothing fetched from elsewhere) and the OpenAPI schema at /openapi.json
(browsable at /docs)."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, AsyncIterator, Optional

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from pygpt_runtime.cli_checks import utf8_text
from pygpt_runtime.onnx_bert import OnnxBERT
from pygpt_runtime.onnx_seq2seq import OnnxSeq2Seq
from pygpt_runtime.run_onnx import OnnxGPT
from pygpt_runtime.runner_config import read_config
from pygpt_runtime.serve.batcher import Batcher
from pygpt_runtime.serve.completions import router as gpt_router
from pygpt_runtime.serve.errors import DeclaredBodyLimit, RequestError, add_handlers
from pygpt_runtime.serve.tasks import TaskQueue, bert_router, translator_router

PLAYGROUND = "playground"  # the page's folder in the package
MODELS = {"gpt": OnnxGPT, "bert": OnnxBERT, "seq2seq": OnnxSeq2Seq}


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
    """An export folder opened for serving, with the worker its family needs (pygpt.serve's
    checkpoint server is a subclass: the same attributes over a torch model)."""

    def __init__(self, folder: str, limits: Limits, variant: str = "fp32",
                 threads: Optional[int] = None):
        self.family = read_config(Path(folder))["family"]
        self.model: Any = MODELS[self.family](folder, variant, threads)
        self.tokenizer = self.model.tokenizer
        self.config = self.model.config
        self.task = self.config.get("task", "translate")
        self.name = Path(folder).resolve().name
        self.created = int(time.time())
        self.limits = limits
        self.batcher = (Batcher(self.model, limits.queue_size, limits.max_batch)
                        if self.family == "gpt" else None)
        self.tasks = TaskQueue(limits.queue_size) if self.family != "gpt" else None

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

    def health(self) -> dict:
        work = ({"active": self.batcher.active, "waiting": len(self.batcher.waiting)}
                if self.batcher is not None else {"waiting": self.tasks.pending})
        return {"status": "ok", "model": self.name, "family": self.family, "task": self.task,
                **({"labels": self.config["labels"]} if "labels" in self.config else {}), **work}

    def routers(self) -> list[APIRouter]:
        """The routes of the served family."""
        if self.family == "gpt":
            return [gpt_router(self)]
        return [bert_router(self) if self.family == "bert" else translator_router(self)]

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        if self.tasks is not None:
            self.tasks.close()


def create_app(served: Served) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        served.close()  # after the open streams have finished or been closed

    app = FastAPI(title="pygpt", summary=f"serving {served.name} ({served.family})",
                  lifespan=lifespan)
    add_handlers(app)
    app.state.max_body_bytes = served.limits.max_body_bytes
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=served.limits.max_body_bytes)
    app.add_middleware(DeclaredBodyLimit, limit=served.limits.max_body_bytes)
    page = resources.files("pygpt_runtime.serve") / PLAYGROUND

    @app.get("/health")
    def health() -> dict:
        return served.health()

    @app.get("/", include_in_schema=False)
    def playground() -> FileResponse:
        return FileResponse(str(page / "index.html"))

    app.mount("/playground", StaticFiles(directory=str(page)), name="playground")
    for routes in served.routers():
        app.include_router(routes)
    return app
