"""The server's GPT decode worker: one thread that decodes every request's rows together, so
that requests arriving together cost about one graph run per token instead of one each.

Requests wait in a bounded queue (a full one refuses at once: `Busy`, the server's 503; the
rows that the batch has room for at the next step do not count against it). Each
step the worker admits waiting rows up to its batch size and runs them with the rows already
decoding (run_onnx.Rows): one graph call prefills the rows just admitted (right-padded, any
lengths) and one decodes all the others, whatever their lengths; the new rows then join the
others. (An export of runner.json format 1, whose graph takes no lengths, runs each group of
rows of one window length in its own calls, as before: rows that started together stay
together, and groups that come to the same length merge.) Every row draws its token with its
own generator by run_onnx.next_token, so a row gives the tokens `pygpt-run` gives for its
prompt and seed alone. A row ends after its max_tokens, or as soon as its consumer stops it (a
stop sequence met, a client gone), which frees its place at the next step. Memory is bounded:
at most batch-size rows, each holding its window and cache only.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

from pygpt_runtime.run_onnx import OnnxGPT, Rows, next_token, window_key
from pygpt_runtime.serve.workers import Generation, RowsWorker, step_failure


Group = tuple[Rows, list[Generation]]


class Batcher(RowsWorker):
    """The decode worker over one exported GPT (RowsWorker: submit, close, health)."""

    def __init__(self, model: OnnxGPT, queue_size: int, max_batch: int):
        super().__init__(model.tokenizer, queue_size, "pygpt-decode")
        self.model, self.max_batch = model, max_batch
        self.context_length = model.config["block_size"]
        self.waiting: deque[Generation] = deque()
        self.groups: list[Group] = []  # the rows decoding, by window
        self.thread.start()

    def _keep(self, generations: list[Generation]) -> None:
        self.waiting.extend(generations)

    def _waiting(self) -> int:
        return len(self.waiting)

    def _room(self) -> int:
        return self.max_batch - self.active  # rows the next step admits

    def _held(self) -> list[Generation]:
        return [*self.waiting, *(g for _, gens in self.groups for g in gens)]

    def prompt_logits(self, ids: list[int]) -> np.ndarray:
        """The logits (len(ids), vocab) of one run over a prompt of at most block_size tokens,
        for its tokens' log-probabilities (echo); onnxruntime runs it beside the worker's
        calls."""
        return self.model.step(np.array([ids], dtype=np.int64), self.model.empty_past(1))[0][0]

    def _admit(self, groups: list[Group]) -> Optional[list[Group]]:
        """The groups with the waiting rows that fit added (new rows grouped by window_key);
        None when closing. Waits while there is nothing to do."""
        with self.ready:
            self.groups = groups
            while not self.waiting and not groups and not self.closing:
                self.ready.wait()
            if self.closing:
                self._end_all("the server is shutting down")
                self.waiting.clear()
                return None
            room = self.max_batch - sum(len(gens) for _, gens in groups)
            admitted = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            self.active = self.max_batch - room + len(admitted)
        block = self.model.config["block_size"]
        by_key: dict[int, list[Generation]] = {}
        for g in admitted:
            by_key.setdefault(window_key(self.model, g.ids[-block:]), []).append(g)
        for gens in by_key.values():
            groups.append((Rows([g.ids[-block:] for g in gens]), gens))
        return groups

    def _step(self, rows: Rows, gens: list[Generation]) -> Optional[Group]:
        """One token for each row of a group; the rows that go on."""
        try:
            logits = rows.logits(self.model)
            tokens = np.array([int(next_token(logits[b:b + 1], rng=g.rng, **g.sampling)[0])
                               for b, g in enumerate(gens)], dtype=np.int64)
        except Exception as e:  # outputs that are not finite numbers, or the model failed
            for g in gens:
                g.send("error", step_failure(e))
            return None
        rows.append(tokens)
        return _subset(rows, gens, [b for b, g in enumerate(gens)
                                    if g.take(int(tokens[b]), logits[b]) and not g.stopped])

    def _run(self) -> None:
        groups: list[Group] = []
        while True:
            groups = [kept for rows, gens in groups if (kept := _subset(
                rows, gens, [b for b, g in enumerate(gens) if not g.stopped]))]
            admitted = self._admit(groups)
            if admitted is None:
                return
            stepped = [done for rows, gens in admitted if (done := self._step(rows, gens))]
            merged: dict[int, Group] = {}
            for rows, gens in stepped:
                key = rows.key(self.model)
                if key in merged:
                    joined, before = merged[key]
                    merged[key] = (joined.join(rows), before + gens)
                else:
                    merged[key] = (rows, gens)
            groups = list(merged.values())
            with self.ready:
                self.groups = groups
                self.active = sum(len(gens) for _, gens in groups)


def _subset(rows: Rows, gens: list[Generation], keep: list[int]) -> Optional[Group]:
    """The group of these rows alone (None: no row)."""
    if not keep:
        return None
    return (rows if len(keep) == len(gens) else rows.take(keep)), [gens[b] for b in keep]
