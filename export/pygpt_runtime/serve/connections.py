"""The server's HTTP connections: uvicorn's h11 protocol, subclassed so that slow or many clients
cannot hold the server. uvicorn itself times a connection out only while it idles between two
requests (--timeout-keep-alive); a client that opens a connection and trickles its headers a
line at a time, or sends nothing, holds a socket for ever, and enough of them use up the
process's file descriptors. Here (Guards, the command's flags):

- a request's headers must be complete within `header_timeout` seconds of the connection's
  opening (or of the first byte of a later request on it), and its body within `body_timeout`
  seconds after them; else a 408 and the connection closes;
- at most `limit_concurrency` connections (uvicorn's option) are served: a request on one past
  it is a 503 at once, except /health and /metrics, so that a full server still says so;
  and a connection opened while twice that many are open is closed unread, so that clients that
  never finish a request hold a bounded number of sockets;
- a request line and headers past `max_header_bytes` are a 431 (h11's max incomplete event
  size bounds those still arriving, a check here those that came in one piece); bytes that are
  not HTTP/1.1 a 400.

Every refusal here is a JSON error body in the app's shape (errors.error_body) with an
X-Request-Id, as the app's own are."""
from __future__ import annotations

import asyncio
import http
import logging
from dataclasses import dataclass
from typing import Any, Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pygpt_runtime.serve.errors import error_body
from pygpt_runtime.serve.request_log import RECORD, new_request_id

OPEN_WHEN_FULL = ("/health", "/metrics")  # what a full server still answers
log = logging.getLogger("pygpt.serve")


@dataclass(frozen=True)
class Guards:
    """The bounds of a connection (the server command's flags)."""
    header_timeout: float = 10.0  # seconds for a request's headers
    body_timeout: float = 30.0  # seconds for its body, once the headers are in
    max_header_bytes: int = 16384  # h11's default

    def __post_init__(self) -> None:
        for flag, value in (("--header-timeout", self.header_timeout),
                            ("--body-timeout", self.body_timeout)):
            if not value > 0:
                raise ValueError(f"{flag} must be > 0 seconds, got {value}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"--max-header-bytes must be at least 1024, got "
                             f"{self.max_header_bytes}")


def guarded_protocol(guards: Guards) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config(http=...), bound to guards."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guards": guards})


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the read deadlines and the connection limit above."""

    guards = Guards()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # uvicorn's own check answers in plain text; this class answers the same limit in JSON.
        self.limit, self.limit_concurrency = self.limit_concurrency, None
        self.app, self.inner_app = self.gate, self.app
        self.deadline: Optional[asyncio.TimerHandle] = None
        self.phase: Optional[str] = None  # what the deadline waits for: "headers" or "body"
        self.timed: Any = None  # the request cycle whose headers were seen last

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.limit is not None and len(self.connections) > 2 * self.limit:
            log.warning("closed a connection unread: %d are open", len(self.connections) - 1)
            transport.close()
            return
        self.arm("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.follow(bool(data))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.follow(False)  # a pipelined request may have been read just now

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """h11 refused the bytes: headers past the limit still unfinished, or not HTTP."""
        if len(self.conn.trailing_data[0]) > self.guards.max_header_bytes:
            self.answer(431, self.too_long())
        else:
            self.answer(400, "the request is not valid HTTP/1.1")

    def too_long(self) -> str:
        return (f"the request's line and headers pass the server's limit of "
                f"{self.guards.max_header_bytes} bytes")

    # The deadlines -----------------------------------------------------------------------------
    def follow(self, data: bool) -> None:
        """Moves the deadline on with the request being read (after uvicorn has parsed)."""
        cycle = self.cycle
        if cycle is not None and cycle is not self.timed:  # a request's headers are in
            self.timed = cycle
            self.disarm()
            if cycle.more_body:
                self.arm("body")
        elif self.phase == "body" and self.conn.their_state is not h11.SEND_BODY:
            self.disarm()  # the body is in (also when the app answered before reading it)
        elif data and self.phase is None and (cycle is None or cycle.response_complete):
            self.arm("headers")  # the first bytes of the next request on the connection

    def arm(self, phase: str) -> None:
        self.disarm()
        seconds = self.guards.header_timeout if phase == "headers" else self.guards.body_timeout
        self.phase, self.deadline = phase, self.loop.call_later(seconds, self.expire)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.phase = None

    def expire(self) -> None:
        phase, self.deadline, self.phase = self.phase, None, None
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started and phase == "body":
            self.transport.close()  # answered already; the client still sends its body
            return
        seconds = self.guards.header_timeout if phase == "headers" else self.guards.body_timeout
        entry = self.cycle.scope.get(RECORD) if phase == "body" else None
        if entry is not None:  # the request's own log line says 408, not what the app answers
            entry["status"], entry["cut"] = 408, True
        self.answer(408, f"the request's {phase} did not arrive within the server's limit of "
                         f"{seconds:g} seconds", entry)

    def answer(self, status: int, message: str, entry: Optional[dict] = None) -> None:
        """Writes a JSON error and closes the connection; entry: the record of the request it
        answers for the app (whose id it carries, and whose log line says it), if any."""
        body = error_body(status, message).body
        head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                f"x-request-id: {entry['id'] if entry else new_request_id()}\r\n"
                "connection: close\r\n\r\n")
        if entry is None:
            log.info("refused status=%d reason=%s", status, {408: "timeout", 431: "headers"}.get(
                status, "http"))
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()

    # The connection limit ----------------------------------------------------------------------
    async def gate(self, scope: Any, receive: Any, send: Any) -> None:
        """The app; a 431 for headers past the limit (h11 bounds only those that arrive in
        parts), a 503 when more connections or requests are open than the limit."""
        size = len(scope["raw_path"]) + len(scope["query_string"]) + sum(
            len(name) + len(value) + 4 for name, value in scope["headers"])
        if size > self.guards.max_header_bytes:
            response = error_body(431, self.too_long())
            response.headers.update({"Connection": "close", "X-Request-Id": new_request_id()})
            log.info("refused status=431 reason=headers")
            return await response(scope, receive, send)
        if (self.limit is not None and scope["path"] not in OPEN_WHEN_FULL
                and max(len(self.connections), len(self.tasks)) > self.limit):
            response = error_body(503, f"the server is serving as many connections as it takes "
                                       f"({self.limit}); try again later")
            response.headers.update({"Retry-After": "1", "Connection": "close",
                                     "X-Request-Id": new_request_id()})
            log.info("refused status=503 reason=connections open=%d", len(self.connections))
            return await response(scope, receive, send)
        await self.inner_app(scope, receive, send)
