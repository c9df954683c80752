"""The server's FastAPI application over a served model (served.py): the routes of its family's
task (completions.py, tasks.py) and of the parts attached to it, GET /health, the playground
page at / (the package's playground/ folder: plain HTML and JavaScript, nothing fetched from
elsewhere) and the OpenAPI schema at /openapi.json (FastAPI's /docs page draws it with scripts
it loads from the internet)."""
from __future__ import annotations

import contextlib
from importlib import resources
from typing import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from pygpt_runtime.serve.errors import DeclaredBodyLimit, add_handlers
from pygpt_runtime.serve.served import Served

PLAYGROUND = "playground"  # the page's folder in the package


def create_app(served: Served) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        served.close()  # after the open streams have finished or been closed

    app = FastAPI(title="pygpt", summary=f"serving {served.name} ({served.family.name})",
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
