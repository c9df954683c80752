"""The server's workers admit by one rule (pygpt_runtime.serve.workers.admit): a request fits
when, after those waiting, it fits the queue and the room the worker's next step takes in; a
closing worker takes none. The task queue (one request running, queue_size waiting) holds to
it: the request past the queue is refused at once with Busy, and the queue frees as requests
end."""
import asyncio
import threading

import pytest

from pygpt_runtime.serve.tasks import TaskQueue
from pygpt_runtime.serve.workers import Busy, admit


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
        running = [asyncio.ensure_future(queue.run("text", release.wait)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert queue.health() == {"waiting": 3}  # one runs, two wait
        with pytest.raises(Busy, match="2 requests wait already"):
            await queue.run("text", release.wait)
        release.set()
        assert await asyncio.gather(*running) == [True] * 3
        assert queue.health() == {"waiting": 0}
        assert await queue.run("text", lambda: 7) == 7
    try:
        asyncio.run(scenario())
    finally:
        release.set()
        queue.close()
