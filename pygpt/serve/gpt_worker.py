"""The decode worker of `python -m pygpt.serve --ckpt` over a GPT checkpoint: completions from
pygpt's own decoding (`stream_batch`, each request's rows as one batch, one request at a time
on one worker thread; a row with a seed draws what `python -m pygpt.generate --seed` draws for
its prompt with that seed), a RowsWorker as the export server's batcher is
(pygpt_runtime.serve.workers), so that the completion routes (pygpt_runtime.serve.completions)
serve it unchanged."""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from pygpt.decoding.sampling import Sampling
from pygpt.models import GPT
from pygpt.serve.model_lock import ModelLock
from pygpt_runtime.serve.served import Limits
from pygpt_runtime.serve.workers import Generation, RowsWorker, step_failure


class TorchWorker(RowsWorker):
    """The decode worker over a torch GPT (RowsWorker: submit, close, health, as the export
    server's batcher.Batcher): one request at a time, its rows decoded together by the model's
    stream_batch; a queue of at most queue_size rows waits (more: Busy, a 503). Each step runs
    under `lock`, which the attention route holds too (its hooks must see its own call only)."""

    def __init__(self, model: GPT, tokenizer, queue_size: int, lock: ModelLock):
        super().__init__(tokenizer, queue_size, "pygpt-torch-decode")
        self.model, self.lock = model, lock
        self.context_length = model.context_length
        self.requests: deque[list[Generation]] = deque()
        self.decoding: list[Generation] = []  # the request being decoded
        self.thread.start()

    def _keep(self, generations: list[Generation]) -> None:
        self.requests.append(generations)

    def _waiting(self) -> int:
        return sum(len(request) for request in self.requests)

    def _room(self) -> int:
        return 0  # a request is taken in when the one before has ended

    def _held(self) -> list[Generation]:
        return [*self.decoding, *(g for request in self.requests for g in request)]

    def _run(self) -> None:
        while True:
            with self.ready:
                while not self.requests and not self.closing:
                    self.ready.wait()
                if self.closing:
                    self._end_all("the server is shutting down")
                    self.requests.clear()
                    return
                self.decoding = self.requests.popleft()
                self.active = len(self.decoding)
            self._decode(self.decoding)
            with self.ready:
                self.decoding, self.active = [], 0

    def _decode(self, rows: list[Generation]) -> None:
        """One request's rows (one max_tokens, sampling and seed) to their ends."""
        first, steps, seen = rows[0], None, []
        going = set(range(len(rows)))
        try:
            generators = (None if first.seed is None
                          else [torch.Generator().manual_seed(g.seed) for g in rows])
            scored = any(g.logprobs is not None for g in rows)
            steps = self.model.stream_batch([g.ids for g in rows], first.max_tokens,
                                            sampling=Sampling(**first.sampling),
                                            generator=generators,
                                            observe=seen.append if scored else None)
            while going:
                with self.lock:
                    tokens = None if self.closing else next(steps, None)
                if tokens is None:
                    break
                logits = seen.pop().float().numpy() if scored else [None] * len(rows)
                for b, token in enumerate(tokens.tolist()):
                    if b in going and (rows[b].stopped or not rows[b].take(token, logits[b])):
                        going.discard(b)
        except Exception as e:  # outputs that are not finite numbers, or the model failed
            for b in going:
                rows[b].send("error", step_failure(e))
            going = set()
        finally:
            if steps is not None:
                steps.close()
        for b in going:  # stopped early by the server's shutdown
            rows[b].send("error", "the server is shutting down")


    def prompt_logits(self, ids: list[int]) -> np.ndarray:
        """The logits (len(ids), vocab) of one run over a prompt of at most block_size tokens,
        for its tokens' log-probabilities (echo); under the lock, between the worker's steps."""
        with self.lock, torch.inference_mode():
            return self.model.prefill(torch.tensor([ids]))[0][0].float().numpy()


def open_gpt(ckpt: str, model: GPT, tokenizer, lock: ModelLock,
             limits: Limits) -> tuple[GPT, TorchWorker, dict]:
    """A GPT checkpoint's opener (pygpt.serve.checkpoint.OPENERS): its completions' routes call
    a TorchWorker over the model."""
    return model, TorchWorker(model, tokenizer, limits.queue_size, lock), {}
