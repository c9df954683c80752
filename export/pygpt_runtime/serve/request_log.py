"""A request's id and its log line (RequestLog, the app's outermost middleware): every response
carries an X-Request-Id, the client's own when it sent a sane one (1 to 128 printable ASCII
characters, no spaces) or a new one, and every request leaves one line on the "pygpt.serve"
logger when it has been answered:

    request id=3f2a... method=POST path="/v1/completions" status=200 duration_ms=412.7 tokens=40

(tokens: a completion's generated tokens, counted by its metrics.TokenClock), and is counted in
the app's metrics by route and status. uvicorn's own access log, which says less, is off."""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("pygpt.serve")
SANE_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces
MAX_PATH_LOGGED = 200
# The scope key of a request's record: a dict of its id, start, status, tokens, and "cut": set
# when the connection answered for the app (connections.py: a body that came too slowly), whose
# status then stands.
RECORD = "pygpt.request"


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's X-Request-Id when it is sane, else a new one."""
    for name, value in headers:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if SANE_ID.fullmatch(text) else new_request_id()
    return new_request_id()


def record(scope: Scope) -> Optional[dict]:
    """The request's record (RequestLog's), where a route adds what its line says."""
    return scope.get(RECORD)


class RequestLog:
    """ASGI middleware: the X-Request-Id header, the log line and the request counter (metrics,
    a metrics.Metrics or None)."""

    def __init__(self, app: ASGIApp, metrics: Any = None):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = request_id(scope["headers"])
        scope[RECORD] = entry = {"id": rid, "start": time.monotonic(), "tokens": None,
                                 "status": 500, "cut": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                if not entry["cut"]:
                    entry["status"] = message["status"]
                message = {**message, "headers": [
                    *(h for h in message.get("headers", ()) if h[0].lower() != b"x-request-id"),
                    (b"x-request-id", rid.encode("ascii"))]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.finish(scope, entry)

    def finish(self, scope: Scope, entry: dict) -> None:
        seconds = time.monotonic() - entry["start"]
        path = scope["path"]
        if len(path) > MAX_PATH_LOGGED:
            path = path[:MAX_PATH_LOGGED] + "..."
        line = (f"request id={entry['id']} method={scope['method']} "
                f"path={json.dumps(path)} status={entry['status']} "
                f"duration_ms={seconds * 1000:.1f}")
        if entry["tokens"] is not None:
            line += f" tokens={entry['tokens']}"
        log.info(line)
        if self.metrics is not None:
            route = scope.get("route")
            self.metrics.request(getattr(route, "path", "(none)"), entry["status"])
