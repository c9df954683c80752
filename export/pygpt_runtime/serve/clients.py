"""What a route does when its client goes away before the answer: the work stops. A streamed
answer stops by itself (Starlette cancels the stream when the connection closes); a whole one
is awaited by unless_gone, which watches the connection meanwhile and, should it close, stops
the work (cancels its task and calls the route's own stop, say a translation's) and ends the
request with ClientGone (logged as a 499, nginx's "client closed request", sent to nobody).
A large answer goes out as a PacedBody, at the pace the client reads it."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, Callable, TypeVar

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
CHUNK = 1 << 16  # bytes a PacedBody sends at a time
SEND_TIMEOUT = 30.0  # seconds a client may take to read one chunk


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def _closed(request: Request) -> None:
    """Returns once the client's connection has closed (the body has been read already, so the
    server's next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T],
                      stop: Callable[[], None] = lambda: None) -> T:
    """work's result, or ClientGone once the client has gone (work cancelled, stop called)."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_closed(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request itself is cancelled (the server stopping)
        stop()
        task.cancel()
        watch.cancel()
        raise
    if task in done:
        watch.cancel()
        return task.result()
    stop()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone


class PacedBody(Response):
    """A JSON answer sent in chunks as fast as the client reads them: each chunk waits until
    the connection has taken the one before (uvicorn's flow control), so a client that does not
    read holds one chunk in the server's buffers, not the whole body; one that takes longer than
    `timeout` seconds for a chunk is cut off. `done` is called once the body has gone, or the
    client has (to free what the answer held)."""

    media_type = "application/json"

    def __init__(self, body: bytes, done: Callable[[], None], timeout: float = SEND_TIMEOUT):
        super().__init__(body)
        self.done, self.timeout = done, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            for at in range(0, len(self.body), CHUNK):
                await asyncio.wait_for(send({"type": "http.response.body", "more_body": True,
                                             "body": self.body[at:at + CHUNK]}), self.timeout)
            await send({"type": "http.response.body", "body": b""})
        except (asyncio.TimeoutError, OSError):
            pass  # the connection is closed unfinished (the server logs the cut response)
        finally:
            self.done()
