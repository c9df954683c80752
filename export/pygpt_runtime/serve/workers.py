"""What the server's workers share: the one rule that admits a request to a worker's bounded
queue or refuses it (admit; a refusal is Busy, the server's 503, at once), a completion's rows
(Generation), and the thread and queue of a worker that decodes rows (RowsWorker: batcher.Batcher
over an export, pygpt.serve.gpt_worker.TorchWorker over a checkpoint). tasks.TaskQueue, which
runs one request at a time, admits by the same rule."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from pygpt_runtime.serve.logprobs import score
from pygpt_runtime.text import TextStream


class Busy(Exception):
    """The queue is full: the request is refused, not queued."""


def admit(waiting: int, arriving: int, queue_size: int, room: int, busy: str,
          closing: bool = False) -> None:
    """Refuses (Busy) a request of `arriving` rows or requests unless they fit, after the
    `waiting` ones, in the queue (queue_size) and the `room` the worker's next step takes in
    besides; a closing worker refuses every request. busy: what the worker holds already, for
    the refusal's message ("3 rows decode and 4 wait already")."""
    if closing or waiting + arriving > queue_size + room:
        raise Busy(f"{busy} (the queue holds {queue_size}); try again later")


def step_failure(e: Exception) -> str:
    """What a failed step tells its rows: a ValueError's own message (outputs that are not
    finite numbers), or what else failed."""
    return str(e) if isinstance(e, ValueError) else f"the model failed ({type(e).__name__}: {e})"


@dataclass
class Generation:
    """One choice's row: what to decode, and `send`, called from the worker thread with
    ("token", text piece, the token scored or None) per token, then ("end", the text held back)
    or ("error", message)."""
    ids: list[int]
    max_tokens: int
    sampling: dict  # run_onnx.next_token's greedy, temperature, top_k, top_p
    rng: np.random.Generator
    send: Callable[..., None]
    seed: Optional[int] = None  # the row's (a torch worker seeds its generator with it)
    logprobs: Optional[int] = None  # the best tokens to score with each token (None: no scores)
    stopped: bool = False  # set by the consumer: no more tokens wanted
    made: int = 0
    text: Optional[TextStream] = field(default=None, repr=False)

    def take(self, token: int, logits: Optional[np.ndarray] = None) -> bool:
        """Sends the token's text (scored by its step's logits (vocab,) if the row asks for
        log-probabilities); whether the row goes on."""
        self.made += 1
        scored = None if self.logprobs is None else score(logits, token, self.logprobs)
        self.send("token", self.text.add(token), scored)
        if self.made >= self.max_tokens:
            self.send("end", self.text.finish())
            return False
        return True


class RowsWorker:
    """A thread that decodes the rows of completions, behind a bounded queue: `submit` from any
    thread, `close` to stop it, `health` for /health; a subclass also gives its model's
    context_length and the logits of a run over a prompt (prompt_logits, for echo). A subclass keeps a request's rows (_keep),
    counts those waiting (_waiting), says how many more its next step takes in (_room), lists
    every row it holds (_held) and runs the loop (_run), holding `ready` while it touches the
    queue; it starts `thread` once its own state is set.

    The thread never dies silently: a step that fails ends its own rows with an error (the
    subclass's _run catches it), and should the loop itself fail, every row held ends with an
    error, `failure` says why, new requests are refused and /health reports it."""

    def __init__(self, tokenizer, queue_size: int, name: str):
        self.tokenizer, self.queue_size = tokenizer, queue_size
        self.active = 0  # rows being decoded
        self.closing = False
        self.failure: Optional[str] = None  # why the loop stopped, if it failed
        self.ready = threading.Condition()  # the queue's lock; notified when rows arrive
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _keep(self, generations: list[Generation]) -> None:
        raise NotImplementedError

    def _waiting(self) -> int:
        raise NotImplementedError

    def _room(self) -> int:
        raise NotImplementedError

    def _held(self) -> list[Generation]:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        try:
            self._run()
        except Exception as e:  # a defect of the loop: its rows, and later requests, are told
            with self.ready:
                self.failure = f"the decode worker failed ({type(e).__name__}: {e})"
                self.closing = True
                self._end_all(self.failure)

    def _end_all(self, why: str) -> None:
        """Ends every row held with an error saying why (holding `ready`)."""
        for g in self._held():
            g.send("error", why)

    def submit(self, generations: list[Generation]) -> None:
        """Queues every row of one request, or none (Busy when they do not all fit)."""
        with self.ready:
            waiting = self._waiting()
            if self.failure is not None:
                raise Busy(self.failure)
            admit(waiting, len(generations), self.queue_size, self._room(),
                  f"{self.active} rows decode and {waiting} wait already", self.closing)
            for g in generations:
                g.text = TextStream(self.tokenizer)
            self._keep(generations)
            self.ready.notify()

    def health(self) -> dict:
        """What /health says of it: the rows decoding and waiting (and its failure, if any)."""
        with self.ready:
            health = {"active": self.active, "waiting": self._waiting()}
            return health if self.failure is None else {**health, "failure": self.failure}

    def close(self) -> None:
        """Stops the worker after its step; rows not finished end with an error. Idempotent."""
        with self.ready:
            self.closing = True
            self.ready.notify()
        self.thread.join()
