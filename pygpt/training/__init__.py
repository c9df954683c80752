"""Training, split by concern: a run made ready (prepare), the loop and evaluation (loop), one
optimizer step (step), the optimizer and schedule (optim), multi-process set-up (distributed)."""
from pygpt.training.loop import evaluate, train
from pygpt.training.optim import lr_at, make_optimizer
from pygpt.training.step import train_step

__all__ = ["evaluate", "lr_at", "make_optimizer", "train", "train_step"]
