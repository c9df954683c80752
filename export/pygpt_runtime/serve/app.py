"""The server's FastAPI application over a served model (served.py): the routes of its family's
task (completions.py, tasks.py) and of the parts attached to it, GET /health, the playground
page at / (the package's playground/ folder: plain HTML and JavaScript, nothing fetched from
elsewhere), GET /metrics (metrics.py) and the OpenAPI schema at /openapi.json (FastAPI's /docs
page draws it with scripts it loads from the internet). A path it has no route for (another
family's, say) is a 404 that names what is served and the routes it has. Around the routes, in
order: the request's id and log line (request_log), the Host check and the API key (access),
the body's size limit (errors)."""
from __future__ import annotations

import contextlib
from importlib import resources
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from pygpt_runtime.serve.access import Access, ApiKey, HostCheck
from pygpt_runtime.serve.errors import DeclaredBodyLimit, add_handlers, error_body
from pygpt_runtime.serve.metrics import CONTENT_TYPE, Metrics
from pygpt_runtime.serve.request_log import RequestLog
from pygpt_runtime.serve.served import Served

PLAYGROUND = "playground"  # the page's folder in the package
MAX_PATH_SHOWN = 100  # the characters of an unknown path a 404 repeats


def create_app(served: Served, access: Access = Access()) -> FastAPI:
    """The app over served; access: the Host names it answers and its API key (none: any)."""
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        served.close()  # after the open streams have finished or been closed

    app = FastAPI(title="pygpt", summary=f"serving {served.summary()}", lifespan=lifespan)
    add_handlers(app)

    @app.exception_handler(404)
    async def not_found(request: Request, _: Exception) -> JSONResponse:
        routes = [f"{method.upper()} {path}" for path, methods in app.openapi()["paths"].items()
                  for method in methods]
        path = request.url.path  # the client's: echoed no longer than a route's name
        shown = path if len(path) <= MAX_PATH_SHOWN else path[:MAX_PATH_SHOWN] + "…"
        return error_body(404, f"no {request.method} {shown} here: this "
                               f"server serves {served.summary()}, at {', '.join(routes)} (the "
                               "playground at /, the API's schema at /openapi.json)")

    app.state.max_body_bytes = served.limits.max_body_bytes
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=served.limits.max_body_bytes)
    app.add_middleware(DeclaredBodyLimit, limit=served.limits.max_body_bytes)
    if access.api_key is not None:
        app.add_middleware(ApiKey, key=access.api_key)
    if access.allowed_hosts is not None:
        app.add_middleware(HostCheck, hosts=access.allowed_hosts)
    app.state.metrics = metrics = Metrics(served.worker.health)
    app.add_middleware(RequestLog, metrics=metrics)  # the outermost: every answer has its id
    page = resources.files("pygpt_runtime.serve") / PLAYGROUND

    @app.get("/health")
    def health() -> JSONResponse:
        answer = served.health()
        return JSONResponse(answer, status_code=200 if answer["status"] == "ok" else 503)

    @app.get("/metrics", include_in_schema=False)
    def metrics_text() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    def playground() -> FileResponse:
        return FileResponse(str(page / "index.html"))

    app.mount("/playground", StaticFiles(directory=str(page)), name="playground")
    for routes in served.routers():
        app.include_router(routes)
    return app
