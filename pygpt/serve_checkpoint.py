"""`python -m pygpt.serve --ckpt RUN`: the HTTP server of a GPT checkpoint, on pygpt's own torch
model, with the attention maps the torch-free server of an export cannot give.

It is the export server (pygpt_runtime.serve_app: the same routes, limits, errors and
playground) over a CheckpointServed: completions come from pygpt's decoding
(`stream_batch`, each request's prompts as one batch, one request at a time on one worker
thread; with a seed, row b draws what `python -m pygpt.generate --seed` draws for it), and
POST /v1/attention gives pygpt.inspect.attention_maps' probabilities for a text, which the
playground draws. Only the --ckpt path imports torch (pygpt.serve stays torch-free for
--model)."""
from __future__ import annotations

import argparse
import threading
import time
from collections import deque
from pathlib import Path
from typing import Optional

import torch
from fastapi import APIRouter

from pygpt.checkpoint import load
from pygpt.decoding.sampling import Sampling
from pygpt.inspect.attention_maps import attention_maps
from pygpt.models import GPT
from pygpt_runtime.onnx_text import TextStream
from pygpt_runtime.serve_app import Limits, Served
from pygpt_runtime.serve_batcher import Busy, Generation
from pygpt_runtime.serve_errors import RequestError
from pygpt_runtime.serve_schemas import AttentionRequest

# The most tokens a text's maps may cover: n_layer * n_head * T^2 numbers go out.
MAX_ATTENTION_TOKENS = 128


class TorchWorker:
    """The decode worker over a torch GPT, with serve_batcher.Batcher's interface (submit,
    close, active, waiting): one request at a time, its rows decoded together by the model's
    stream_batch; a queue of at most queue_size rows waits (more: Busy, a 503). Each step runs
    under `lock`, which the attention route holds too (its hooks must see its own call only)."""

    def __init__(self, model: GPT, tokenizer, queue_size: int, lock: threading.Lock):
        self.model, self.tokenizer, self.queue_size, self.lock = model, tokenizer, queue_size, lock
        self.requests: deque[list[Generation]] = deque()
        self.active = 0
        self.closing = False
        self.ready = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="pygpt-torch-decode", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> list[Generation]:
        return [g for request in self.requests for g in request]

    def submit(self, generations: list[Generation]) -> None:
        """Queues one request's rows, or refuses them all (Busy)."""
        with self.ready:
            if self.closing or len(self.waiting) + len(generations) > self.queue_size:
                raise Busy(f"{self.active} rows decode and {len(self.waiting)} wait already "
                           f"(the queue holds {self.queue_size}); try again later")
            for g in generations:
                g.text = TextStream(self.tokenizer)
            self.requests.append(generations)
            self.ready.notify()

    def close(self) -> None:
        """Stops the worker after its step; rows not finished end with an error."""
        with self.ready:
            self.closing = True
            self.ready.notify()
        self.thread.join()

    def _run(self) -> None:
        while True:
            with self.ready:
                while not self.requests and not self.closing:
                    self.ready.wait()
                if self.closing:
                    for g in self.waiting:
                        g.send("error", "the server is shutting down")
                    self.requests.clear()
                    return
                rows = self.requests.popleft()
                self.active = len(rows)
            self._decode(rows)
            with self.ready:
                self.active = 0

    def _decode(self, rows: list[Generation]) -> None:
        """One request's rows (one max_tokens, sampling and seed) to their ends."""
        first = rows[0]
        generators = (None if first.seed is None
                      else [torch.Generator().manual_seed(first.seed) for _ in rows])
        steps = self.model.stream_batch([g.ids for g in rows], first.max_tokens,
                                        sampling=Sampling(**first.sampling), generator=generators)
        going = set(range(len(rows)))
        try:
            while going:
                with self.lock:
                    tokens = None if self.closing else next(steps, None)
                if tokens is None:
                    break
                for b, token in enumerate(tokens.tolist()):
                    if b in going and (rows[b].stopped or not rows[b].take(token)):
                        going.discard(b)
        except ValueError as e:  # outputs that are not finite numbers
            for b in going:
                rows[b].send("error", str(e))
            going = set()
        finally:
            steps.close()
        for b in going:  # stopped early by the server's shutdown
            rows[b].send("error", "the server is shutting down")


class CheckpointServed(Served):
    """A GPT checkpoint opened for serving: Served's attributes over the torch model, and the
    attention route."""

    def __init__(self, ckpt: str, limits: Limits, threads: Optional[int] = None):
        if threads is not None:
            torch.set_num_threads(threads)
        model, tokenizer = load(ckpt)
        if not isinstance(model, GPT):
            raise ValueError(f"{ckpt} holds a {model.config.arch} model; --ckpt serves a GPT "
                             "(export it and serve the export with --model)")
        self.family, self.task, self.model, self.tokenizer = "gpt", "generate", model, tokenizer
        self.config = {"block_size": model.config.block_size}
        self.name = Path(ckpt).resolve().name
        self.created = int(time.time())
        self.limits, self.tasks, self.lock = limits, None, threading.Lock()
        self.batcher = TorchWorker(model, tokenizer, limits.queue_size, self.lock)
        self.max_attention_tokens = min(model.config.block_size, MAX_ATTENTION_TOKENS)

    def health(self) -> dict:
        cfg = self.model.config
        return {**super().health(), "attention": {
            "layers": cfg.n_layer, "heads": cfg.n_head, "max_tokens": self.max_attention_tokens}}

    def attention(self, text: str, layer: Optional[int]) -> dict:
        """The text's tokens and the attention probabilities (per layer, per head, a (T, T)
        matrix, query by key) of one layer or every layer; a 400 naming the field for a text
        the model cannot read or longer than max_attention_tokens, or a layer it lacks."""
        n_layer = self.model.config.n_layer
        if layer is not None and layer >= n_layer:
            raise RequestError(400, "layer", f"layer must be below {n_layer}, got {layer}")
        ids = self.encode(text, "text")
        if len(ids) > self.max_attention_tokens:
            raise RequestError(400, "text", f"text is {len(ids)} tokens; attention maps take "
                                            f"at most {self.max_attention_tokens}")
        try:
            with self.lock:
                maps = attention_maps(self.model, self.tokenizer, [text])[0]
        except ValueError as e:  # a text of no tokens
            raise RequestError(400, "text", f"text: {e}") from None
        chosen = range(n_layer) if layer is None else [layer]
        return {"tokens": list(maps.tokens), "n_layer": n_layer,
                "n_head": self.model.config.n_head,
                "layers": [{"layer": i, "probs": maps.layers("self")[i].probs.tolist()}
                           for i in chosen]}

    def routers(self) -> list[APIRouter]:
        routes = APIRouter()

        @routes.post("/v1/attention")
        def attention(body: AttentionRequest) -> dict:
            return self.attention(body.text, body.layer)

        return [*super().routers(), routes]


def open_checkpoint(args: argparse.Namespace, limits: Limits) -> CheckpointServed:
    """pygpt_runtime.serve_command's hook for --ckpt."""
    return CheckpointServed(args.ckpt, limits, args.threads)
