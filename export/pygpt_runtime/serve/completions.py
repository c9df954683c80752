"""The server's GPT routes, in OpenAI's shapes: POST /v1/completions (whole, or streamed as
server-sent events ending in `data: [DONE]`) and GET /v1/models. A request's prompts become rows
of the decode worker (batcher.py); here their tokens' text is gathered, cut at the first
stop sequence (text that may begin one is held back until it cannot), and counted."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, AsyncIterator, Optional

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pygpt_runtime.serve.workers import Generation, RowsWorker
from pygpt_runtime.serve.errors import ModelError, RequestError
from pygpt_runtime.serve.schemas import CompletionRequest

if TYPE_CHECKING:
    from pygpt_runtime.serve.metrics import TokenClock


class StopText:
    """One choice's text as it streams: what may be shown, cut before the first stop sequence."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1  # the tail that may begin one
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that piece makes safe to show; sets stopped at a stop sequence."""
        self.pending += piece
        found = [at for at in (self.pending.find(s) for s in self.stops) if at >= 0]
        if found:
            shown, self.pending, self.stopped = self.pending[:min(found)], "", True
            return shown
        safe = len(self.pending) - self.hold
        shown, self.pending = self.pending[:safe], self.pending[safe:]
        return shown

    def flush(self) -> str:
        shown, self.pending = self.pending, ""
        return shown


class Choice:
    """A prompt's row and its text so far."""

    def __init__(self, ids: list[int], stops: list[str]):
        self.prompt_tokens, self.tokens = len(ids), 0
        self.text, self.finish_reason = StopText(stops), None  # "stop" / "length" when done

    def event(self, kind: str, payload: str) -> str:
        """The text an event of the worker adds (see Generation.send)."""
        if kind == "error":
            raise ModelError(payload)
        if kind == "token":
            self.tokens += 1
            shown = self.text.feed(payload)
            if self.text.stopped:
                self.finish_reason = "stop"
            return shown
        self.finish_reason = "length"
        return self.text.feed(payload) + ("" if self.text.stopped else self.text.flush())


class Completion:
    """One request's rows in the worker, their events coming back on this event loop."""

    def __init__(self, worker: RowsWorker, body: CompletionRequest, rows: list[list[int]],
                 clock: Optional[TokenClock] = None):
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.clock = clock  # metrics.TokenClock: told of each token
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.choices = [Choice(ids, body.stops()) for ids in rows]
        self.rows = [Generation(ids, body.max_tokens, body.sampling(),
                                np.random.default_rng(body.seed), self._sender(loop, i),
                                seed=body.seed)
                     for i, ids in enumerate(rows)]
        if body.max_tokens == 0:
            for i in range(len(rows)):
                self.queue.put_nowait((i, "end", ""))
        else:
            worker.submit(self.rows)

    def _sender(self, loop: asyncio.AbstractEventLoop, index: int):
        def send(kind: str, payload: str) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, kind, payload))
        return send

    async def pieces(self) -> AsyncIterator[tuple[int, str]]:
        """(choice, text) as it comes, until every choice has finished; stops the rows left
        when the consumer goes away (a client that disconnects frees its rows)."""
        try:
            while any(c.finish_reason is None for c in self.choices):
                index, kind, payload = await self.queue.get()
                choice = self.choices[index]
                if choice.finish_reason is not None:
                    continue  # the row's tokens after its stop sequence
                text = choice.event(kind, payload)
                if kind == "token" and self.clock is not None:
                    self.clock.token(index)
                if choice.finish_reason == "stop":
                    self.rows[index].stopped = True
                yield index, text
        finally:
            for row in self.rows:
                row.stopped = True

    def usage(self) -> dict:
        prompt = sum(c.prompt_tokens for c in self.choices)
        made = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}

    def response(self, model: str, choices: list[dict], usage: Optional[dict]) -> dict:
        body = {"id": self.id, "object": "text_completion", "created": self.created,
                "model": model, "choices": choices}
        return body if usage is None else {**body, "usage": usage}


def choice(index: int, text: str, finish_reason: Optional[str]) -> dict:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def router(served) -> APIRouter:
    """The routes over a served GPT (served.Served: its name, its decode worker, the limits)."""
    routes = APIRouter()

    @routes.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": served.name, "object": "model",
                                            "created": served.created, "owned_by": "pygpt"}]}

    @routes.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if body.model is not None and body.model != served.name:
            raise RequestError(404, "model", f"no model {body.model!r} here; this server "
                                             f"serves {served.name!r}")
        limits = served.limits
        if body.max_tokens > limits.max_tokens:
            raise RequestError(400, "max_tokens", f"max_tokens must be at most "
                                                  f"{limits.max_tokens}, got {body.max_tokens}")
        if len(body.prompts()) > limits.max_batch:
            raise RequestError(400, "prompt", f"at most {limits.max_batch} prompts a request, "
                                              f"got {len(body.prompts())}")
        rows = [served.encode(text, "prompt" if isinstance(body.prompt, str) else f"prompt[{n}]")
                for n, text in enumerate(body.prompts())]
        completion = Completion(served.worker, body, rows,
                                request.app.state.metrics.clock(request))
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_events(completion, served.name, usage),
                                     media_type="text/event-stream")
        texts = ["" for _ in rows]
        async for index, text in completion.pieces():
            texts[index] += text
        return completion.response(served.name, [
            choice(i, t, c.finish_reason) for i, (t, c) in enumerate(zip(texts, completion.choices))
        ], completion.usage())

    return routes


async def _events(completion: Completion, model: str, usage: bool) -> AsyncIterator[str]:
    """The server-sent events of a streamed completion: a chunk per piece of text, a last one
    per choice with its finish_reason, the usage if asked, then [DONE]."""
    def data(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"
    try:
        async for index, text in completion.pieces():
            reason = completion.choices[index].finish_reason
            if text or reason is not None:
                yield data(completion.response(model, [choice(index, text, reason)], None))
    except ModelError as e:  # the worker's error: the stream ends with it
        yield data({"error": {"message": str(e), "type": "server_error"}})
    if usage:
        yield data(completion.response(model, [], completion.usage()))
    yield "data: [DONE]\n\n"
