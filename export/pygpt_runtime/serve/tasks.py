"""The server's routes of the tasks run a request at a time: POST /v1/fill-mask, /v1/classify,
/v1/tag and /v1/answer (a BERT's four tasks), POST /v1/translate (a translator's). Each request runs whole on one worker
thread (TaskQueue) with the runner's own calls (onnx_bert.OnnxBERT, onnx_seq2seq.OnnxSeq2Seq),
so it answers what pygpt-run prints; the requests waiting for it are bounded (a full queue:
503). Each router is given the served model (served.Served)."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from fastapi import APIRouter, Request

from pygpt_runtime.onnx_search import Search, stop_requested
from pygpt_runtime.serve.clients import unless_gone
from pygpt_runtime.serve.errors import RequestError
from pygpt_runtime.serve.schemas import (AnswerRequest, ClassifyRequest, FillMaskRequest,
                                         TagRequest, TranslateRequest)
from pygpt_runtime.serve.workers import admit


class TaskQueue:
    """One worker thread; at most queue_size requests wait for it."""

    def __init__(self, queue_size: int):
        self.queue_size, self.pending = queue_size, 0
        self.closing = False
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="pygpt-task")

    async def run(self, request: Request, param: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the worker; its ValueError (the request's content) a 400 naming param.
        Should the client go away first, the request ends (clients.ClientGone) and a search
        that fn runs stops at its next step (onnx_search.stop_requested)."""
        with self.lock:  # pending counts the request running too, in the worker's one place
            admit(self.pending, 1, self.queue_size, 1,
                  f"{self.pending - 1} requests wait already", self.closing)
            self.pending += 1
        gone = threading.Event()
        try:
            return await unless_gone(request, asyncio.wrap_future(
                self.pool.submit(_until, gone.is_set, fn, *args)), gone.set)
        except ValueError as e:
            raise RequestError(400, param, str(e)) from None
        except asyncio.CancelledError:
            if self.closing:  # a request still waiting when the server stopped
                raise RequestError(503, None, "the server is shutting down") from None
            raise
        finally:
            with self.lock:
                self.pending -= 1

    def health(self) -> dict:
        """What /health says of it: the requests running and waiting."""
        return {"waiting": self.pending}

    def close(self) -> None:
        """Refuses new requests, cancels those waiting and lets the running one finish."""
        self.closing = True
        self.pool.shutdown(wait=True, cancel_futures=True)


def _until(stopped: Callable[[], bool], fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), its searches stopping once stopped() says so."""
    token = stop_requested.set(stopped)
    try:
        return fn(*args)
    finally:
        stop_requested.reset(token)


def fill_mask_router(served) -> APIRouter:
    routes, model = APIRouter(), served.model

    @routes.post("/v1/fill-mask")
    async def fill_mask(body: FillMaskRequest, request: Request) -> dict:
        served.encode(body.text, "text", parse_specials=True)
        fills = await served.worker.run(request, "text", model.fill_mask, body.text, body.top_k)
        return {"masks": [[{"token": token, "score": score} for token, score in candidates]
                          for candidates in fills]}
    return routes


def classify_router(served) -> APIRouter:
    routes, model = APIRouter(), served.model

    @routes.post("/v1/classify")
    async def classify(body: ClassifyRequest, request: Request) -> dict:
        for name, text in (("text", body.text), ("text_pair", body.text_pair)):
            if text is not None:
                _not_blank(served, text, name)
        pairs = None if body.text_pair is None else [body.text_pair]
        probs = (await served.worker.run(request, "text", model.classify, [body.text], pairs))[0]
        ranked = sorted(zip(model.labels, probs.tolist()), key=lambda lp: -lp[1])
        return {"label": ranked[0][0],
                "probabilities": [{"label": label, "probability": p} for label, p in ranked]}
    return routes


def _not_blank(served, text: str, field: str) -> None:
    """A 400 naming field for text the tokenizer cannot take, too long, or blank."""
    served.encode(text, field)
    if not text.strip():
        raise RequestError(400, field, f"{field} must not be blank")


def tag_router(served) -> APIRouter:
    routes, model = APIRouter(), served.model

    @routes.post("/v1/tag")
    async def tag(body: TagRequest, request: Request) -> dict:
        """The text's named entities, in order, each with its type and characters [start,
        end) in the text (what pygpt-run --text prints)."""
        _not_blank(served, body.text, "text")
        found = await served.worker.run(request, "text", model.tag, body.text, "text")
        return {"entities": [{"type": kind, "start": start, "end": end,
                              "text": body.text[start:end]} for kind, start, end in found]}
    return routes


def answer_router(served) -> APIRouter:
    routes, model = APIRouter(), served.model

    @routes.post("/v1/answer")
    async def answer(body: AnswerRequest, request: Request) -> dict:
        """The answer's text and characters [start, end) in the context (all null when none
        is given, which no_answer allows), its score (start + end logit) and [CLS]'s."""
        for name, text in (("question", body.question), ("context", body.context)):
            _not_blank(served, text, name)
        found = await served.worker.run(request, "question", model.answer, body.question,
                                        body.context, body.no_answer, body.null_threshold,
                                        "question")
        given = bool(found.text)
        return {"answer": found.text if given else None, "start": found.start if given else None,
                "end": found.end if given else None, "score": found.score,
                "null_score": found.null_score}
    return routes


def translate_router(served) -> APIRouter:
    routes, model = APIRouter(), served.model

    @routes.post("/v1/translate")
    async def translate(body: TranslateRequest, request: Request) -> dict:
        texts = [body.text] if isinstance(body.text, str) else body.text
        if len(texts) > served.limits.max_batch:
            raise RequestError(400, "text", f"at most {served.limits.max_batch} sentences a "
                                            f"request, got {len(texts)}")
        for n, text in enumerate(texts):
            served.encode(text, "text" if isinstance(body.text, str) else f"text[{n}]")
        search = Search(beam=body.beam, length_penalty=body.length_penalty,
                        max_extra=body.max_len_extra)
        return {"translations": await served.worker.run(request, "beam", model.translate, texts, search)}
    return routes
