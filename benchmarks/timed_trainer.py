"""The training step the benchmarks time: what pygpt.train does per optimizer step (schedule,
gradient accumulation, clipping, AdamW), on one model, optionally through torch.compile."""
import time

import torch

from pygpt.model import GPT
from pygpt.train import lr_at, make_optimizer


class Trainer:
    """One model + optimizer; step() is one timed optimizer step of the (maybe compiled) model."""

    def __init__(self, model_cfg, train_cfg, kernels, init_state, compile_mode=False):
        """compile_mode: False for eager, else torch.compile's mode (None: its default)."""
        self.model = GPT(model_cfg, kernels=kernels)
        self.model.load_state_dict(init_state)
        self.model.train()
        self.step_model = (torch.compile(self.model, mode=compile_mode)
                           if compile_mode is not False else self.model)
        self.cfg = train_cfg
        self.optimizer = make_optimizer(self.model, train_cfg)
        self.step_no = 0

    def step(self, batches):
        """batches: grad_accum (x, y) pairs. Returns (seconds, loss)."""
        t0 = time.perf_counter()
        lr = lr_at(self.step_no, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = 0.0
        for x, y in batches:
            loss = self.step_model(x, y).loss / len(batches)
            loss.backward()
            total += loss.item()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        self.step_no += 1
        return dt, total
