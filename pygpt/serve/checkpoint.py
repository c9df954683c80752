"""`python -m pygpt.serve --ckpt RUN`: the HTTP server of a checkpoint of any family, on pygpt's
own torch model, with the attention maps the torch-free server of an export cannot give.

It is the export server (pygpt_runtime.serve.app: the same routes, limits, errors and
playground) over a CheckpointServed, whose model answers each route with pygpt's own code: a
GPT's completions from its decoding (pygpt.serve.gpt_worker), a BERT's fill-mask or
classification and a translator's translations from the functions of pygpt's commands
(pygpt.serve.torch_tasks, on the export server's task worker: one request at a time, a bounded
queue); and POST /v1/attention gives pygpt.inspect.attention_maps' probabilities for a text
(pygpt.serve.attention), which the playground draws. Only the --ckpt path imports torch
(pygpt.serve stays torch-free for --model)."""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Optional

import torch
from fastapi import APIRouter

from pygpt.storage.checkpoint import load
from pygpt.models import BERT, GPT
from pygpt.serve.attention import ServedAttention, attention_router
from pygpt.serve.gpt_worker import TorchWorker
from pygpt.serve.torch_tasks import TorchBERT, TorchTranslator
from pygpt_runtime.serve.app import Limits, Served
from pygpt_runtime.serve.tasks import TaskQueue


class CheckpointServed(Served):
    """A checkpoint opened for serving: Served's attributes over the torch model of its family
    (`model`: what the family's routes call), and the attention route."""

    def __init__(self, ckpt: str, limits: Limits, threads: Optional[int] = None):
        if threads is not None:
            torch.set_num_threads(threads)
        network, tokenizer = load(ckpt)
        self.family, self.tokenizer = network.config.arch, tokenizer
        self.config = {"block_size": network.config.block_size}
        self.name = Path(ckpt).resolve().name
        self.created = int(time.time())
        self.limits, self.lock = limits, threading.Lock()
        self.batcher, self.tasks = None, None
        if isinstance(network, GPT):
            self.task, self.model = "generate", network
            self.batcher = TorchWorker(network, tokenizer, limits.queue_size, self.lock)
        elif isinstance(network, BERT):
            self.model = TorchBERT(ckpt, network, tokenizer, self.lock)
            self.task = self.model.task
            if self.model.labels is not None:
                self.config["labels"] = self.model.labels
        else:
            self.task, self.model = "translate", TorchTranslator(network, tokenizer, self.lock)
        if self.batcher is None:
            self.tasks = TaskQueue(limits.queue_size)
        self.attention = ServedAttention(network, tokenizer, self.lock, self.encode)

    def health(self) -> dict:
        return {**super().health(), "attention": self.attention.describe()}

    def routers(self) -> list[APIRouter]:
        return [*super().routers(), attention_router(self.attention)]


def open_checkpoint(args: argparse.Namespace, limits: Limits) -> CheckpointServed:
    """pygpt_runtime.serve.command's hook for --ckpt."""
    return CheckpointServed(args.ckpt, limits, args.threads)
