"""The training step the benchmarks time: what pygpt.train does per optimizer step (schedule,
gradient accumulation, clipping, AdamW), on one model, optionally through torch.compile."""
import statistics
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


def interleaved_steps(trainers, step_batches, start, steps, block):
    """Runs `steps` steps of every trainer on the same batches (step_batches[start:]), in blocks
    of `block` steps per trainer in turn, so a change in the machine's load hits all alike.
    Returns each trainer's step times and losses."""
    times = {name: [] for name in trainers}
    losses = {name: [] for name in trainers}
    done = 0
    while done < steps:
        n = min(block, steps - done)
        for name, trainer in trainers.items():
            for i in range(start + done, start + done + n):
                dt, loss = trainer.step(step_batches[i])
                times[name].append(dt)
                losses[name].append(loss)
        done += n
    return times, losses


def step_stats(times, tokens_per_step):
    """Median and quartiles of step times (ms) and tokens/s from the median."""
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [med, med, med]
    return {"median_ms": med * 1e3, "q1_ms": q[0] * 1e3, "q3_ms": q[2] * 1e3,
            "tokens_per_s": tokens_per_step / med}
