"""The server's errors: every refusal is a JSON body in OpenAI's shape, {"error": {"message",
"type", "param", "code"}}, with a 4xx status naming the field at fault (a 503 when the queue is
full, a 413 for a body past the server's limit, a 500 only for a model whose outputs are not
finite), never a traceback."""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from pygpt_runtime.serve.clients import ClientGone
from pygpt_runtime.serve.workers import Busy

CLIENT_GONE = 499  # nginx's "client closed request": in the log, never seen by the client


class RequestError(Exception):
    """A request the server refuses: its status, the field at fault, why."""

    def __init__(self, status: int, param: Optional[str], message: str):
        super().__init__(message)
        self.status, self.param, self.message = status, param, message


class ModelError(Exception):
    """The model failed on a request (outputs that are not finite numbers)."""


def error_body(status: int, message: str, param: Optional[str] = None) -> JSONResponse:
    kind = ("invalid_request_error" if status < 500 else
            "overloaded_error" if status == 503 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": None}}, status_code=status)


def field_name(loc: tuple) -> str:
    """The field of a pydantic error location ("body", "stop", 1, ...): "stop[1]"; the
    location's union-branch names (a type such as "str") are left out."""
    name = ""
    for part in loc[1:]:
        if isinstance(part, int):
            name += f"[{part}]"
        elif not any(c in part for c in "[]-") and part not in ("str", "int", "float", "bool",
                                                                  "list", "function-after"):
            name += f".{part}" if name else part
    return name or "body"


def add_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        # The deepest location: in a union ("a text or a list of texts") the branch that got
        # furthest, a list's item.
        first = max(e.errors(), key=lambda error: len(error.get("loc", ())))
        param = field_name(tuple(first.get("loc", ("body",))))
        if first.get("type") == "json_invalid":
            return error_body(400, f"the body is not valid JSON: {first.get('msg')}", "body")
        return error_body(400, f"{param}: {first.get('msg')}", param)

    @app.exception_handler(RequestError)
    async def refused(_: Request, e: RequestError) -> JSONResponse:
        return error_body(e.status, e.message, e.param)

    @app.exception_handler(Busy)
    async def busy(_: Request, e: Busy) -> JSONResponse:
        response = error_body(503, f"the server is busy: {e}")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(ClientGone)
    async def gone(_: Request, e: ClientGone) -> JSONResponse:
        return error_body(CLIENT_GONE, "the client closed its connection before its answer")

    @app.exception_handler(ModelError)
    async def failed(_: Request, e: ModelError) -> JSONResponse:
        return error_body(500, str(e))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 413:  # starlette's RequestBodyLimitMiddleware, counting
            return too_large(request.app.state.max_body_bytes)
        return error_body(e.status_code, str(e.detail))


def too_large(limit: int) -> JSONResponse:
    return error_body(413, f"the request body is larger than the server's limit of {limit} "
                           "bytes", "body")


class DeclaredBodyLimit:
    """ASGI middleware: a 413 before reading a body whose Content-Length passes the limit (a body
    without one is counted as it comes by starlette's RequestBodyLimitMiddleware, inside)."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers", ())).get(b"content-length", b"0")
        if scope["type"] == "http" and (not declared.isdigit() or int(declared) > self.limit):
            return await too_large(self.limit)(scope, receive, send)
        await self.app(scope, receive, send)
