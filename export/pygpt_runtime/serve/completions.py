"""The server's GPT routes, in OpenAI's shapes: POST /v1/completions (whole, or streamed as
server-sent events ending in `data: [DONE]`) and GET /v1/models. A request's choices (n a
prompt) become rows of the decode worker (batcher.py); here their tokens' text is gathered, cut
at the first stop sequence (text that may begin one is held back until it cannot), counted, and
given with the tokens' log-probabilities when asked (logprobs.py; with echo, the prompt's text
and log-probabilities come first)."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pygpt_runtime.cli_checks import MAX_SEED
from pygpt_runtime.serve.clients import unless_gone
from pygpt_runtime.serve.errors import ModelError, RequestError
from pygpt_runtime.serve.logprobs import Logprobs, Scored, score_prompt
from pygpt_runtime.serve.workers import Generation, RowsWorker
from pygpt_runtime.serve.schemas import CompletionRequest
from pygpt_runtime.text import TextStream

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
    """One choice's row and its text so far (after the prompt's, with echo), with its tokens'
    log-probabilities if asked."""

    def __init__(self, stops: list[str], logprobs: Optional[Logprobs], echo: str):
        self.tokens, self.finish_reason = 0, None  # "stop" / "length" when done
        self.text, self.logprobs = StopText(stops), logprobs
        self.made = self.shown = len(echo)  # characters of its text made, and shown

    def event(self, kind: str, payload: str, scored: Optional[Scored] = None) -> str:
        """The text an event of the worker adds (see Generation.send)."""
        if kind == "error":
            raise ModelError(payload)
        if kind == "token":
            self.tokens += 1
            if self.logprobs is not None:
                self.logprobs.add(scored, self.made)
            self.made += len(payload)
            shown = self.text.feed(payload)
            if self.text.stopped:
                self.finish_reason = "stop"
        else:
            self.finish_reason = "length"
            shown = self.text.feed(payload) + ("" if self.text.stopped else self.text.flush())
        self.shown += len(shown)
        return shown

    def take_logprobs(self) -> Optional[dict]:
        """The log-probabilities of the tokens shown since the last call (None: not asked)."""
        if self.logprobs is None:
            return None
        return self.logprobs.take(None if self.finish_reason == "length" else self.shown)


class Completion:
    """One request's rows in the worker (n choices a prompt, in OpenAI's order: prompt by
    prompt), their events coming back on this event loop. With echo, each choice's text
    begins with its prompt (and its log-probabilities with the prompt's, `prompt_scores`)."""

    def __init__(self, worker: RowsWorker, body: CompletionRequest, rows: list[list[int]],
                 tokenizer: Any, prompt_scores: Optional[list[list[Scored]]] = None,
                 clock: Optional[TokenClock] = None):
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.clock = clock  # metrics.TokenClock: told of each token
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompt_tokens = sum(len(ids) for ids in rows)
        loop = asyncio.get_running_loop()
        prompt_of = [p for p in range(len(rows)) for _ in range(body.n)]  # each choice's
        self.echoes = [body.prompts()[p] if body.echo else "" for p in prompt_of]
        self.choices = [Choice(body.stops(), None if body.logprobs is None
                               else Logprobs(tokenizer), echo) for echo in self.echoes]
        if prompt_scores is not None:  # echo with logprobs: each choice's prompt entries
            offsets = [_offsets(tokenizer, ids) for ids in rows]
            for c, p in zip(self.choices, prompt_of):
                for scored, at in zip(prompt_scores[p], offsets[p]):
                    c.logprobs.add(scored, at)
        self.rows = [Generation(rows[p], body.max_tokens, body.sampling(),
                                np.random.default_rng(seed), self._sender(loop, c), seed=seed,
                                logprobs=body.logprobs)
                     for c, (p, seed) in enumerate(zip(prompt_of, _seeds(body)))]
        if body.max_tokens == 0:
            for c in range(len(self.rows)):
                self.queue.put_nowait((c, "end", "", None))
        else:
            worker.submit(self.rows)

    def _sender(self, loop: asyncio.AbstractEventLoop, index: int):
        def send(kind: str, payload: str, scored: Optional[Scored] = None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, kind, payload, scored))
        return send

    async def pieces(self) -> AsyncIterator[tuple[int, str]]:
        """(choice, text) as it comes, until every choice has finished; stops the rows left
        when the consumer goes away (a client that disconnects frees its rows)."""
        try:
            while any(c.finish_reason is None for c in self.choices):
                index, kind, payload, scored = await self.queue.get()
                choice = self.choices[index]
                if choice.finish_reason is not None:
                    continue  # the row's tokens after its stop sequence
                text = choice.event(kind, payload, scored)
                if kind == "token" and self.clock is not None:
                    self.clock.token(index)
                if choice.finish_reason == "stop":
                    self.rows[index].stopped = True
                yield index, text
        finally:
            for row in self.rows:
                row.stopped = True

    async def texts(self) -> list[str]:
        """Every choice's whole text."""
        texts = list(self.echoes)
        async for index, text in self.pieces():
            texts[index] += text
        return texts

    def usage(self) -> dict:
        made = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": made,
                "total_tokens": self.prompt_tokens + made}

    def response(self, model: str, choices: list[dict], usage: Optional[dict]) -> dict:
        body = {"id": self.id, "object": "text_completion", "created": self.created,
                "model": model, "choices": choices}
        return body if usage is None else {**body, "usage": usage}

    def choice(self, index: int, text: str) -> dict:
        c = self.choices[index]
        return {"index": index, "text": text, "logprobs": c.take_logprobs(),
                "finish_reason": c.finish_reason}


def _seeds(body: CompletionRequest) -> list[Optional[int]]:
    """Each row's seed: choice i of a prompt draws with seed + i (mod 2^64), so that choice 0
    draws what the runner's --seed draws and the others differ; None: fresh."""
    return [None if body.seed is None else (body.seed + i) % (MAX_SEED + 1)
            for _ in body.prompts() for i in range(body.n)]


def _offsets(tokenizer: Any, ids: list[int]) -> list[int]:
    """Where each token's text begins in the text of ids."""
    stream, at, offsets = TextStream(tokenizer), 0, []
    for token in ids:
        offsets.append(at)
        at += len(stream.add(token))
    return offsets


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
        rows_asked = len(body.prompts()) * body.n
        if rows_asked > limits.max_batch:
            raise RequestError(400, "n" if body.n > 1 else "prompt",
                               f"at most {limits.max_batch} choices a request (prompts x n), "
                               f"got {rows_asked}")
        rows = [served.encode(text, "prompt" if isinstance(body.prompt, str) else f"prompt[{n}]")
                for n, text in enumerate(body.prompts())]
        scores = None
        if body.echo and body.logprobs is not None:  # the prompts' tokens scored, as given
            worker, most = served.worker, served.worker.context_length
            for n, ids in enumerate(rows):
                if len(ids) > most:
                    raise RequestError(400, "echo", f"echo with logprobs scores a prompt of at "
                                                    f"most {most} tokens (the model's "
                                                    f"context); prompt {n} has {len(ids)}")
            scores = [score_prompt(await asyncio.to_thread(worker.prompt_logits, ids), ids,
                                   body.logprobs) for ids in rows]
        completion = Completion(served.worker, body, rows, served.tokenizer, scores,
                                request.app.state.metrics.clock(request))
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_events(completion, served.name, usage),
                                     media_type="text/event-stream")
        texts = await unless_gone(request, completion.texts())
        return completion.response(served.name, [completion.choice(i, text)
                                                 for i, text in enumerate(texts)],
                                   completion.usage())

    return routes


async def _events(completion: Completion, model: str, usage: bool) -> AsyncIterator[str]:
    """The server-sent events of a streamed completion: a chunk per piece of text, a last one
    per choice with its finish_reason, the usage if asked, then [DONE]."""
    def data(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"
    try:
        for index, echo in enumerate(completion.echoes):
            if echo:
                yield data(completion.response(model, [completion.choice(index, echo)], None))
        async for index, text in completion.pieces():
            if text or completion.choices[index].finish_reason is not None:
                yield data(completion.response(model, [completion.choice(index, text)], None))
    except ModelError as e:  # the worker's error: the stream ends with it
        yield data({"error": {"message": str(e), "type": "server_error"}})
    if usage:
        yield data(completion.response(model, [], completion.usage()))
    yield "data: [DONE]\n\n"
