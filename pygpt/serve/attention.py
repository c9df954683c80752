"""POST /v1/attention of `python -m pygpt.serve --ckpt`: a text's attention maps, the softmax
probabilities pygpt.inspect.attention_maps computes on the checkpoint's torch model, for every
family: a GPT's causal self-attention over the text, a BERT's bidirectional one over [CLS] text
[SEP] (padding excluded; a text holding a [SEP] is a pair, "question [SEP] context"), and a translator's encoder self-attention over the source (the text),
its decoder self-attention over [BOS] + the target, and its cross-attention, target tokens (rows)
by source tokens (columns), where a trained translator shows the word alignment. The target is
the request's `target`, or else the model's greedy translation of the text.

The answer names each map's part ("self", "encoder", "decoder", "cross") and carries both token
lists (`tokens`: the text's; `target_tokens`: the decoder's, empty but for a translator); the
probabilities are per head a (queries, keys) matrix. The maps are computed under the lock the
model's worker holds for each of its calls, so the recording hooks see only their own run.

Maps are large, so they are bounded: a text of at most MAX_ATTENTION_TOKENS tokens, an answer
of at most MAX_ATTENTION_NUMBERS probabilities (ask for a layer or a part beyond: a 400), made
one at a time on a worker thread and sent at the pace the client reads (clients.PacedBody); at
most IN_FLIGHT answers are being made or sent at once, and the request past them is a 503."""
from __future__ import annotations

import json
from typing import Callable, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response
from torch import nn

from pygpt.families import attention_maps, family
from pygpt.serve.model_lock import ModelLock
from pygpt.tokenizer import Tokenizer
from pygpt_runtime.serve.clients import PacedBody
from pygpt_runtime.serve.errors import RequestError
from pygpt_runtime.serve.schemas import AttentionRequest
from pygpt_runtime.serve.tasks import TaskQueue
from pygpt_runtime.serve.workers import Busy

# The most tokens a text's (or a target's) maps may cover: layers * heads * T^2 numbers go out.
MAX_ATTENTION_TOKENS = 128
MAX_ATTENTION_NUMBERS = 1 << 20  # the most probabilities one answer holds (~20 MB of JSON)
IN_FLIGHT = 4  # answers being made or sent at once; more: 503

Encode = Callable[[str, str, bool], list]  # (text, field, parse_specials): ids, or a 400


class ServedAttention:
    """The attention maps of one served torch model (any family), request by request."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, lock: ModelLock,
                 encode: Encode):
        self.model, self.tokenizer, self.lock, self.encode = model, tokenizer, lock, encode
        self.family = family(model.config.arch)
        self.parts = {part: len(layers)
                      for part, layers in self.family.attention_layers(model).items()}
        self.max_tokens = min(model.config.block_size, MAX_ATTENTION_TOKENS)
        self.worker = TaskQueue(IN_FLIGHT - 1)  # makes the answers, one at a time
        self.in_flight = 0  # answers being made or sent (touched on the event loop only)

    def sent(self) -> None:
        """An answer has gone (or its client has)."""
        self.in_flight -= 1

    def describe(self) -> dict:
        """What /health says of the maps: each part's layers, the heads, the most tokens."""
        return {"parts": self.parts, "heads": self.model.config.n_head,
                "max_tokens": self.max_tokens}

    def _parts(self, part: Optional[str], layer: Optional[int]) -> list[str]:
        """The parts asked for; a 400 naming the field for a part or layer the model lacks."""
        if part is not None and part not in self.parts:
            raise RequestError(400, "part", f"part must be one of {', '.join(self.parts)} for "
                                            f"this model, got {part!r}")
        chosen = list(self.parts) if part is None else [part]
        most = min(self.parts[p] for p in chosen)
        if layer is not None and layer >= most:
            raise RequestError(400, "layer", f"layer must be below {most}, got {layer}")
        return chosen

    def _check_length(self, text: str, field: str, extra: int, most: int) -> int:
        """The tokens of text with `extra` specials; a 400 naming field for a text the
        tokenizer cannot take, or whose tokens pass most."""
        n = len(self.encode(text, field, bool(self.family.text_specials))) + extra
        if n > most:
            with_specials = " with its special tokens" if extra else ""
            raise RequestError(400, field, f"{field} is {n} tokens{with_specials}; attention "
                                           f"maps take at most {most}")
        return n

    def check(self, body: AttentionRequest) -> list[str]:
        """The parts asked for; a 400 naming the field for a request this model cannot answer
        or whose maps hold more numbers than an answer may."""
        parts = self._parts(body.part, body.layer)
        if body.target is not None and not self.family.has_target:
            raise RequestError(400, "target", "target is for a translator; this model reads "
                                              "the text alone")
        n = self._check_length(body.text, "text", len(self.family.text_specials),
                               self.max_tokens)
        if body.target is not None:  # [BOS] + the target's tokens
            self._check_length(body.target, "target", 1,
                               min(self.model.max_target_length, self.max_tokens))
        layers = sum(1 if body.layer is not None else self.parts[part] for part in parts)
        numbers = layers * self.model.config.n_head * n * n  # a target's maps: at most as many
        if numbers > MAX_ATTENTION_NUMBERS * (2 if self.family.has_target else 1):
            raise RequestError(400, "layer", f"the maps asked for hold about {numbers:,} numbers "
                                             f"({layers} layers of {self.model.config.n_head} "
                                             f"heads over {n} tokens); an answer holds at most "
                                             f"{MAX_ATTENTION_NUMBERS:,}: ask for one layer or "
                                             "part, or a shorter text")
        return parts

    def maps(self, body: AttentionRequest, parts: list[str]) -> dict:
        """The answer to one request (module docstring), of the parts check gave for it."""
        try:
            with self.lock:
                maps = attention_maps(self.model, self.tokenizer, [body.text],
                                      [body.target] if self.family.has_target else None)[0]
        except ValueError as e:  # a text of no tokens
            raise RequestError(400, "text", f"text: {e}") from None
        layers = [body.layer] if body.layer is not None else None
        return {"tokens": list(maps.tokens), "target_tokens": list(maps.target_tokens),
                "parts": self.parts, "n_head": self.model.config.n_head,
                "layers": [{"part": part, "layer": i, "probs": maps.layers(part)[i].probs.tolist()}
                           for part in parts for i in (layers or range(self.parts[part]))]}

    def answer(self, body: AttentionRequest, parts: list[str]) -> bytes:
        """The answer's JSON (made on the worker thread: the maps as lists are large)."""
        return json.dumps(self.maps(body, parts)).encode()


def attention_router(attention: ServedAttention) -> APIRouter:
    routes = APIRouter()

    @routes.post("/v1/attention")
    async def attention_route(body: AttentionRequest, request: Request) -> Response:
        parts = attention.check(body)
        if attention.in_flight >= IN_FLIGHT:
            raise Busy(f"{attention.in_flight} attention answers are being made or sent "
                       f"already (at most {IN_FLIGHT})")
        attention.in_flight += 1
        try:
            answer = await attention.worker.run(request, "text", attention.answer, body,
                                                 parts)
        except BaseException:
            attention.in_flight -= 1
            raise
        return PacedBody(answer, done=attention.sent)

    return routes
