"""The server's errors: every refusal is a JSON body in OpenAI's shape, {"error": {"message",
"type", "param", "code"}}, with a 4xx status naming the field at fault (a 503 when the queue is
full, a 500 only for a model whose outputs are not finite), never a traceback. Bodies larger
than the server's limit are refused before they are read whole (BodyLimit)."""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pygpt_runtime.serve_batcher import Busy


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
        first = e.errors()[0]
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

    @app.exception_handler(ModelError)
    async def failed(_: Request, e: ModelError) -> JSONResponse:
        return error_body(500, str(e))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        return error_body(e.status_code, str(e.detail))


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is a 413, whether its Content-Length
    says so or it streams past the limit."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self._refuse(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise RequestError(413, "body", self._message())
            return message
        await self.app(scope, counted, send)

    def _message(self) -> str:
        return f"the request body is larger than the server's limit of {self.limit} bytes"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_body(413, self._message(), "body")(scope, receive, send)
