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

from pygpt import checkpoint
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


def load_teacher(cfg: TrainConfig, model_cfg: ModelConfig, tokenizer: Tokenizer,
                 labels: Optional[list[str]]) -> nn.Module:
    """The teacher of cfg.distill_from (eval mode, no gradients), checked against the student:
    ValueError (one line) if it is of another family, has another tokenizer, a shorter
    context, or another task (a classifier teacher for a classifier with the same labels)."""
    path = Path(cfg.distill_from)
    if path.resolve() == Path(cfg.out).resolve():
        raise ValueError("--distill-from and --out must differ: the teacher is never modified")
    with torch.random.fork_rng(devices=[]):  # building it must not move the student's RNG
        teacher, teacher_tokenizer = checkpoint.load(path, kernels=cfg.kernels,
                                                     device=cfg.device)
    where = f"the teacher {path}"
    if teacher.config.arch != model_cfg.arch:
        raise ValueError(f"{where} is a {teacher.config.arch}, the student a {model_cfg.arch}: "
                         "distillation needs one family")
    difference = tokenizer_difference(tokenizer, teacher_tokenizer)
    if difference is not None:
        raise ValueError(f"{where} has another tokenizer: {difference}")
    if teacher.config.block_size < model_cfg.block_size:
        raise ValueError(f"{where} has a context of {teacher.config.block_size}, shorter than "
                         f"the student's {model_cfg.block_size}")
    teacher_labels = checkpoint.load_labels(path)
    if cfg.task == "classify" and teacher_labels != labels:
        shown = "no labels (not a classifier)" if teacher_labels is None else teacher_labels
        raise ValueError(f"{where} has {shown}, the student's labels are {labels}")
    if cfg.task != "classify" and teacher_labels is not None:
        raise ValueError(f"{where} is a classifier: it distils --task classify only")
    return teacher.requires_grad_(False)


class Distillation(nn.Module):
    """The training forward of a student beside its teacher: forward(**batch) gives the mixed
    loss. The student stays the model that is trained, evaluated and saved; the teacher stays
    in eval mode whatever mode this module is put in."""

    def __init__(self, student: nn.Module, teacher: nn.Module, fam: Family, cfg: TrainConfig):
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
