"""Multi-process data parallelism on PyTorch's own engine: under torchrun (which sets
WORLD_SIZE, RANK and the rendezvous address) the ranks join a process group (gloo on CPU, NCCL
on GPU) and the model is wrapped in DistributedDataParallel. With one process every method is a
no-op, so the training loop reads the same either way."""
from __future__ import annotations

import contextlib
import os
from typing import ContextManager, Optional

import torch
import torch.distributed as dist

from pygpt.tokenizer import Tokenizer, tokenizer_from_json


class Distributed:
    def __init__(self, device: str):
        """Joins the process group when there is more than one process."""
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        if self.world > 1:
            if not dist.is_initialized():
                dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
            self.rank = dist.get_rank()

    @property
    def is_main(self) -> bool:
        """Rank 0, which prepares the data and writes every file."""
        return self.rank == 0

    def share_tokenizer(self, tokenizer: Optional[Tokenizer]) -> Tokenizer:
        """Rank 0's tokenizer, on every rank."""
        if self.world == 1:
            return tokenizer
        payload = [tokenizer.to_json() if tokenizer is not None else None]
        dist.broadcast_object_list(payload, src=0)
        return tokenizer or tokenizer_from_json(payload[0], "rank 0's tokenizer")

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def no_sync(self, model: torch.nn.Module, skip: bool) -> ContextManager:
        """Inside, backward does not all-reduce (for all but the last micro-batch)."""
        return model.no_sync() if self.world > 1 and skip else contextlib.nullcontext()

    def stop(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
