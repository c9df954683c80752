"""Training a student on a teacher's softened outputs (--distill-from TEACHER): the teacher is
loaded and checked against the student (family, tokenizer, task, context), then runs in
inference mode on the student's own batches, beside it, in `Distillation`, the forward the
training step calls: each family says which logits its loss counts (`Family.distill_rows`) and
pygpt.nn.distill_loss mixes the KL with the usual loss. The teacher is never saved with the
student; its path and the distillation's settings are the student's TrainConfig fields
(distill_from, distill_temperature, distill_alpha), so --resume loads it again. Loading it
draws no random numbers, and it has no dropout running, so with alpha 0 a run equals one
without a teacher bit for bit."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn

from pygpt.storage import checkpoint
from pygpt.config import ModelConfig, TrainConfig
from pygpt.families import Family
from pygpt.nn.distill_loss import distill_loss
from pygpt.tokenizer import Tokenizer


class DistilledOutput(NamedTuple):
    loss: Tensor  # alpha * T^2 * KL + (1 - alpha) * the student's usual loss


def tokenizer_difference(student: Tokenizer, teacher: Tokenizer) -> Optional[str]:
    """What differs between two tokenizers (the teacher's side first), or None if they are
    one."""
    if student.kind != teacher.kind:
        return f"a {teacher.kind} tokenizer, the student's is {student.kind}"
    if student.vocab_size != teacher.vocab_size:
        return f"{teacher.vocab_size} tokens, the student's {student.vocab_size}"
    if student.to_json() == teacher.to_json():
        return None
    for i in range(teacher.vocab_size):
        if student.decode([i]) != teacher.decode([i]):
            return (f"token {i} {teacher.decode([i])!r}, the student's "
                    f"{student.decode([i])!r}")
    return "the same tokens but other settings (the tokenizer files differ)"


class Teacher(NamedTuple):
    model: nn.Module  # eval mode, no gradients
    tokenizer: Tokenizer
    labels: Optional[list[str]]  # a classifier's
    where: str  # how errors name it


def load_teacher(cfg: TrainConfig, model_cfg: ModelConfig) -> Teacher:
    """The teacher of cfg.distill_from, checked against the student's settings: ValueError (one
    line) if it is of another family, has a shorter context, or is a classifier for another
    task than classification (or not one for it), or the student a tagger or a question
    answerer (--task tag, qa, whose per-token logits distillation does not compare yet)."""
    if cfg.task in ("tag", "qa"):
        raise ValueError("--distill-from distils pretraining and --task classify, not yet "
                         f"--task {cfg.task}")
    path = Path(cfg.distill_from)
    if path.resolve() == Path(cfg.out).resolve():
        raise ValueError("--distill-from and --out must differ: the teacher is never modified")
    with torch.random.fork_rng(devices=[]):  # building it must not move the student's RNG
        model, tokenizer = checkpoint.load(path, kernels=cfg.kernels, device=cfg.device)
    teacher = Teacher(model.requires_grad_(False), tokenizer, checkpoint.load_labels(path),
                      f"the teacher {path}")
    if model.config.arch != model_cfg.arch:
        raise ValueError(f"{teacher.where} is a {model.config.arch}, the student a "
                         f"{model_cfg.arch}: distillation needs one family")
    if model.config.block_size < model_cfg.block_size:
        raise ValueError(f"{teacher.where} has a context of {model.config.block_size}, shorter "
                         f"than the student's {model_cfg.block_size}")
    if cfg.task == "classify" and teacher.labels is None:
        raise ValueError(f"{teacher.where} is not a classifier: --task classify distils one")
    if cfg.task != "classify" and teacher.labels is not None:
        raise ValueError(f"{teacher.where} is a classifier: it distils --task classify only")
    return teacher


def check_teacher(teacher: Teacher, tokenizer: Tokenizer, labels: Optional[list[str]]) -> None:
    """ValueError (one line) unless the teacher has the student's tokenizer and labels (a
    classifier's, the task's; None for pretraining)."""
    difference = tokenizer_difference(tokenizer, teacher.tokenizer)
    if difference is not None:
        raise ValueError(f"{teacher.where} has another tokenizer: {difference}")
    if teacher.labels != labels:
        raise ValueError(f"{teacher.where} has the labels {teacher.labels}, the student "
                         f"{labels}")


class Distillation(nn.Module):
    """The training forward of a student beside its teacher: forward(**batch) gives the mixed
    loss. The student stays the model that is trained, evaluated and saved; the teacher stays
    in eval mode whatever mode this module is put in."""

    def __init__(self, student: nn.Module, teacher: nn.Module, fam: Family, cfg: TrainConfig):
        """teacher: its model (Teacher.model)."""
        super().__init__()
        self.student, self.teacher, self.family = student, teacher.eval(), fam
        self.temperature, self.alpha = cfg.distill_temperature, cfg.distill_alpha

    def train(self, mode: bool = True) -> "Distillation":
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, **batch: Tensor) -> DistilledOutput:
        output, student_rows = self.family.distill_rows(self.student, batch, with_output=True)
        with torch.inference_mode():
            _, teacher_rows = self.family.distill_rows(self.teacher, batch, with_output=False)
        return DistilledOutput(distill_loss(output.loss, student_rows, teacher_rows,
                                            self.temperature, self.alpha))
