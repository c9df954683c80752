"""The server's workers, unit by unit. They admit by one rule (pygpt_runtime.serve.workers.admit):
a request fits when, after those waiting, it fits the queue and the room the worker's next step
takes in; a closing worker takes none. The task queue (one request running, queue_size waiting)
holds to it, and a request whose client goes away ends, its search stopping at its next step.
A decode step that fails ends its own rows with an error and the worker goes on; a worker
whose loop fails tells every row it holds, /health and later requests. A large answer goes
out at the pace its client reads, and a client who stops reading is cut off."""
import asyncio
import threading

import pytest

from pygpt_runtime.onnx_search import Stopped, _go_on, stop_requested
from pygpt_runtime.serve.clients import CHUNK, ClientGone, PacedBody
from pygpt_runtime.serve.tasks import TaskQueue
from pygpt_runtime.serve.workers import Busy, Generation, RowsWorker, admit


class Client:
    """A request's connection, as the routes see it: it closes when `leave` is set."""

    def __init__(self):
        self.leave = asyncio.Event()

    async def receive(self) -> dict:
        await self.leave.wait()
        return {"type": "http.disconnect"}


def test_the_admission_rule():
    admit(waiting=3, arriving=2, queue_size=4, room=1, busy="")  # 5 fit in 4 + 1
    admit(waiting=0, arriving=6, queue_size=4, room=2, busy="")
    with pytest.raises(Busy, match=r"^3 wait already \(the queue holds 4\); try again later$"):
        admit(waiting=3, arriving=3, queue_size=4, room=1, busy="3 wait already")
    with pytest.raises(Busy):
        admit(waiting=0, arriving=1, queue_size=4, room=1, busy="", closing=True)


def test_the_task_queue_runs_one_and_holds_queue_size():
    queue, release = TaskQueue(queue_size=2), threading.Event()

    async def scenario():
        client = Client()
        running = [asyncio.ensure_future(queue.run(client, "text", release.wait))
                   for _ in range(3)]
        await asyncio.sleep(0.05)
        assert queue.health() == {"waiting": 3}  # one runs, two wait
        with pytest.raises(Busy, match="2 requests wait already"):
            await queue.run(client, "text", release.wait)
        release.set()
        assert await asyncio.gather(*running) == [True] * 3
        assert queue.health() == {"waiting": 0}
        assert await queue.run(client, "text", lambda: 7) == 7
    try:
        asyncio.run(scenario())
    finally:
        release.set()
        queue.close()


def test_a_request_whose_client_leaves_stops_its_search_and_frees_the_queue():
    queue, steps = TaskQueue(queue_size=1), []

    def search():  # a search's loop: it checks before each step whether to go on
        while True:
            _go_on()
            steps.append(1)
            threading.Event().wait(0.001)

    async def scenario():
        client = Client()
        running = asyncio.ensure_future(queue.run(client, "beam", search))
        await asyncio.sleep(0.05)
        assert queue.health() == {"waiting": 1} and steps
        client.leave.set()
        with pytest.raises(ClientGone):
            await running
        assert queue.health() == {"waiting": 0}
        assert await queue.run(Client(), "text", lambda: 7) == 7  # the worker is free again
    try:
        asyncio.run(scenario())
    finally:
        queue.close()
    made = len(steps)
    threading.Event().wait(0.05)
    assert len(steps) == made  # no step after it stopped


def test_a_search_goes_on_outside_a_server():
    _go_on()  # no server asked it to stop: nothing raised
    token = stop_requested.set(lambda: True)
    try:
        with pytest.raises(Stopped):
            _go_on()
    finally:
        stop_requested.reset(token)


class Rows:
    """A row's events, as a completion receives them."""

    def __init__(self, n: int, max_tokens: int = 3):
        import numpy as np

        self.events = [[] for _ in range(n)]
        self.rows = [Generation([1, 2], max_tokens, {"greedy": True, "temperature": 1.0,
                                                      "top_k": None, "top_p": None},
                                np.random.default_rng(0),
                                lambda kind, text, scored=None, i=i:
                                self.events[i].append((kind, text)))
                     for i in range(n)]


class FailsOnce:
    """A GPT whose first decode fails as a defect would; later ones give token 1."""
    context_length = 16

    def __init__(self):
        self.calls = 0

    def stream_batch(self, prompts, max_tokens, sampling=None, generator=None, observe=None):
        import torch

        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("boom")
        return (torch.ones(len(prompts), dtype=torch.long) for _ in range(max_tokens))


class Tokens:
    """A tokenizer whose every token reads "x"."""
    token_bytes = None

    def decode(self, ids):
        return "x" * len(ids)


def test_a_step_that_fails_ends_its_rows_with_an_error_and_the_worker_goes_on():
    from pygpt.serve.gpt_worker import TorchWorker

    worker = TorchWorker(FailsOnce(), Tokens(), queue_size=4, lock=threading.Lock())
    try:
        failed, served = Rows(2), Rows(1)
        worker.submit(failed.rows)
        worker.submit(served.rows)
        for _ in range(500):
            if served.events[0] and served.events[0][-1][0] == "end":
                break
            threading.Event().wait(0.01)
        assert failed.events == [[("error", "the model failed (RuntimeError: boom)")]] * 2
        assert [kind for kind, _ in served.events[0]] == ["token", "token", "token", "end"]
        assert worker.health() == {"active": 0, "waiting": 0}
    finally:
        worker.close()


def test_a_worker_whose_loop_fails_tells_its_rows_health_and_later_requests():
    class Broken(RowsWorker):
        def __init__(self):
            super().__init__(Tokens(), 4, "broken")
            self.waiting, self.go = [], threading.Event()
            self.thread.start()

        def _keep(self, generations):
            self.waiting.extend(generations)
            self.go.set()

        def _waiting(self):
            return len(self.waiting)

        def _room(self):
            return 0

        def _held(self):
            return self.waiting

        def _run(self):
            self.go.wait()
            raise KeyError("lost")

    worker, rows = Broken(), Rows(2)
    worker.submit(rows.rows)
    worker.thread.join(5)
    why = "the decode worker failed (KeyError: 'lost')"
    assert rows.events == [[("error", why)]] * 2
    assert worker.health() == {"active": 0, "waiting": 2, "failure": why}
    with pytest.raises(Busy, match=r"^the decode worker failed"):
        worker.submit(Rows(1).rows)
    worker.close()


def test_a_paced_body_goes_at_the_readers_pace_and_cuts_one_who_stops_reading():
    body, freed = bytes(range(256)) * 1000, []

    async def scenario(reads: int) -> bytes:
        got = []

        async def send(message):
            if message["type"] == "http.response.body" and len(got) >= reads:
                await asyncio.Event().wait()  # the client reads no more
            got.append(message.get("body", b""))

        await PacedBody(body, done=lambda: freed.append(1), timeout=0.2)(
            {"type": "http"}, None, send)
        return b"".join(got)

    assert asyncio.run(scenario(10 ** 6)) == body and freed == [1]
    assert len(asyncio.run(scenario(2))) == CHUNK and freed == [1, 1]  # headers, one chunk
