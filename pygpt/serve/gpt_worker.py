"""The decode worker of `python -m pygpt.serve --ckpt` over a GPT checkpoint: completions from
pygpt's own decoding (`stream_batch`, each request's prompts as one batch, one request at a
time on one worker thread; with a seed, row b draws what `python -m pygpt.generate --seed` draws
for it), with the interface of the export server's batcher (pygpt_runtime.serve.batcher), so
that the completion routes (pygpt_runtime.serve.completions) serve it unchanged."""
from __future__ import annotations

import threading
from collections import deque

import torch

from pygpt.decoding.sampling import Sampling
from pygpt.models import GPT
from pygpt_runtime.text import TextStream
from pygpt_runtime.serve.batcher import Busy, Generation
from pygpt_runtime.serve.served import Limits


class TorchWorker:
    """The decode worker over a torch GPT, with pygpt_runtime.serve.batcher.Batcher's interface (submit,
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

    def health(self) -> dict:
        """What /health says of it: the rows decoding and waiting."""
        return {"active": self.active, "waiting": len(self.waiting)}

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


def open_gpt(ckpt: str, model: GPT, tokenizer, lock: threading.Lock,
             limits: Limits) -> tuple[GPT, TorchWorker, dict]:
    """A GPT checkpoint's opener (pygpt.serve.checkpoint.OPENERS): its completions' routes call
    a TorchWorker over the model."""
    return model, TorchWorker(model, tokenizer, limits.queue_size, lock), {}
