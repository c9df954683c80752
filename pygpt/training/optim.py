"""The optimizer and the learning-rate schedule of a training run."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from pygpt.config import TrainConfig


def schedule_end(cfg: TrainConfig) -> int:
    """The step where the schedule reaches cfg.min_lr: lr_decay_iters, by default max_iters."""
    return cfg.lr_decay_iters if cfg.lr_decay_iters is not None else cfg.max_iters


def warmup_warning(cfg: TrainConfig) -> Optional[str]:
    """A warning when the warmup takes more than a third of the schedule (the default 100 steps
    in a 100-step run: all of it, so the run never decays), else None. The
    schedule is left as asked: capping the warmup would tie it to --max-iters, and a run
    resumed with a larger --max-iters would no longer equal a straight one."""
    end = schedule_end(cfg)
    if cfg.warmup_iters * 3 <= end:
        return None
    whole = ": the whole run is warmup, with no decay" if cfg.warmup_iters >= end else ""
    return (f"warning: --warmup-iters {cfg.warmup_iters} is {cfg.warmup_iters / end:.0%} of the "
            f"{end}-step schedule{whole}; about a tenth (--warmup-iters {end // 10}) is usual")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cfg.schedule down to cfg.min_lr at lr_decay_iters; or,
    for inverse_sqrt, down as 1 / sqrt(step) (continuous at the warmup's end), never below
    cfg.min_lr and with no end."""
    if step < cfg.warmup_iters:
        return cfg.lr * (step + 1) / cfg.warmup_iters
    end = schedule_end(cfg)
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "inverse_sqrt":
        return max(cfg.min_lr, cfg.lr * math.sqrt(max(1, cfg.warmup_iters) / (step + 1)))
    if step >= end:
        return cfg.min_lr
    if cfg.schedule == "wsd":
        cooldown_start = end - cfg.cooldown_frac * end
        if step < cooldown_start:
            return cfg.lr
        progress = (step - cooldown_start) / max(1.0, end - cooldown_start)
        return cfg.lr + progress * (cfg.min_lr - cfg.lr)
    progress = (step - cfg.warmup_iters) / max(1, end - cfg.warmup_iters)
    if cfg.schedule == "linear":
        return cfg.lr + progress * (cfg.min_lr - cfg.lr)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW decays only the weights of linear layers (not norms, biases or embeddings, which
    includes a tied LM head), with its fused kernel on CUDA (one launch for all parameters); SGD
    is plain."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay = {id(m.weight): m.weight for m in model.modules()
             if isinstance(m, nn.Linear) and id(m.weight) not in embeddings}
    rest = [p for p in model.parameters() if id(p) not in decay]
    groups = [{"params": list(decay.values()), "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    fused = torch.device(cfg.device).type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=True if fused else None)
