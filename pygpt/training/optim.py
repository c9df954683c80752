"""The optimizer and the learning-rate schedule of a training run."""
from __future__ import annotations

import math

import torch
from torch import nn

from pygpt.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cfg.schedule down to cfg.min_lr at lr_decay_iters."""
    if step < cfg.warmup_iters:
        return cfg.lr * (step + 1) / cfg.warmup_iters
    end = cfg.lr_decay_iters if cfg.lr_decay_iters is not None else cfg.max_iters
    if cfg.schedule == "constant":
        return cfg.lr
    if step >= end:
        return cfg.min_lr
    if cfg.schedule == "wsd":
        cooldown_start = end - cfg.cooldown_frac * end
        if step < cooldown_start:
            return cfg.lr
        progress = (step - cooldown_start) / max(1.0, end - cooldown_start)
        return cfg.lr + progress * (cfg.min_lr - cfg.lr)
    progress = (step - cfg.warmup_iters) / max(1, end - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW decays only the weights of linear layers (not norms, biases or embeddings, which
    includes a tied LM head); SGD is plain."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay = {id(m.weight): m.weight for m in model.modules()
             if isinstance(m, nn.Linear) and id(m.weight) not in embeddings}
    rest = [p for p in model.parameters() if id(p) not in decay]
    groups = [{"params": list(decay.values()), "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
