"""A training run's settings, as the dataclass TrainConfig, saved in config.json so that --resume
continues the same run (every field is a flag of `python -m pygpt.train`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

from pygpt.config.fields import check_field_types, opt

# The kernel sets a model can run on (see pygpt.kernels): ours, and the plain-PyTorch reference.
KERNEL_SETS = ("ext", "torch")
# The number types a model computes in (pygpt.mixed_precision): float32, or autocast to a low one.
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class TrainConfig:
    """How a run trains; saved in config.json so --resume continues the same run."""

    data: Optional[str] = opt(None, "a UTF-8 text file (default: the shipped tiny-Shakespeare)",
                              ("gpt", "bert"), file=True)
    tokenizer: Literal["char", "bpe", "wordpiece"] = opt(
        "char", "characters, a byte-level BPE or a WordPiece (BERT's) trained on the data with "
                "--vocab-size tokens")
    init_from: Optional[str] = opt(None, "fine-tune: start from this checkpoint's weights and "
                                         "tokenizer (it is never modified)", file=True)
    task: Literal["pretrain", "classify", "tag", "qa"] = opt(
        "pretrain", "pretrain: next-token (gpt) or masked-LM (bert) on a text; classify: train a "
                    "bert to classify labelled texts (--data: TSV or CSV with label and text "
                    "columns, optionally text_pair), usually --init-from a pretrained bert; its "
                    "default preset is bert-classify; tag: train a bert to tag named entities "
                    "(--data: CoNLL, a word and its BIO tag a line, a blank line between "
                    "sentences), its default preset bert-tag; qa: train a bert to answer "
                    "questions from a context (--data: SQuAD v1.1 or v2.0 JSON), its default "
                    "preset bert-qa")
    val_data: Optional[str] = opt(None, "classify, tag, qa: labelled validation data (default: "
                                        "a tenth of --data held out, stratified by label for "
                                        "classify, of the sentences for tag, of the paragraphs "
                                        "for qa)", "bert", task=("classify", "tag", "qa"),
                                  file=True)
    src_data: Optional[str] = opt(None, "seq2seq: source sentences, one a line (.gz: gzip)",
                                  "seq2seq", file=True)
    tgt_data: Optional[str] = opt(None, "seq2seq: their translations, line for line", "seq2seq",
                                  file=True)
    val_src: Optional[str] = opt(None, "seq2seq: validation sources (default: a fixed 1 in 20 "
                                       "training pairs, at most 2000, held out)", "seq2seq",
                                 file=True)
    val_tgt: Optional[str] = opt(None, "seq2seq: the validation sources' translations",
                                 "seq2seq", file=True)
    distill_from: Optional[str] = opt(None, "a teacher checkpoint to distil (never modified)",
                                      file=True)
    distill_temperature: float = opt(2.0, "distillation: the softmax temperature T")
    distill_alpha: float = opt(0.5, "distillation: loss = alpha * T^2 * KL(teacher || student) "
                                    "+ (1 - alpha) * the usual loss")
    out: str = opt("out", "output folder for the checkpoint, metrics and plots")
    batch_size: int = opt(12, "sequences per micro-batch (gpt, bert; a translator's are sized "
                              "by --max-tokens)", ("gpt", "bert"))
    max_tokens: int = opt(4096, "seq2seq: tokens per micro-batch (sources + targets, padding "
                                "included), instead of --batch-size", "seq2seq")
    bleu_sentences: int = opt(100, "seq2seq: validation sentences translated (greedy) at each "
                                   "evaluation for val_bleu (0: none)", "seq2seq")
    label_smoothing: float = opt(0.0, "seq2seq: label smoothing of the training loss (the "
                                      "Transformer paper's is 0.1)", "seq2seq")
    grad_accum: int = opt(1, "micro-batches per optimizer step")
    max_iters: int = opt(2000, "optimizer steps in total (with --resume: the new total)")
    epochs: Optional[float] = opt(None, "classify, tag, qa: passes over the training examples "
                                        "instead of --max-iters (the steps they take, epochs x "
                                        "examples / batch, are settled once the data is read "
                                        "and saved as max_iters)", "bert",
                                  task=("classify", "tag", "qa"))
    optimizer: Literal["adamw", "sgd"] = opt("adamw", "optimizer")
    lr: float = opt(1e-3, "peak learning rate")
    min_lr: float = opt(0.0, "learning rate at the end of the decay")
    warmup_iters: int = opt(100, "steps of linear warmup from 0 to --lr (a warning when it takes"
                                 " over a third of the schedule, e.g. all of a 100-step run)")
    warmup_frac: Optional[float] = opt(None, "warmup as a fraction of the run's steps (e.g. 0.1) "
                                             "instead of --warmup-iters: settled into "
                                             "warmup_iters once the steps are known (with "
                                             "--epochs, once the data is read)")
    schedule: Literal["cosine", "linear", "wsd", "constant", "inverse_sqrt"] = opt(
        "wsd", "after warmup: cosine decay to --min-lr; linear: straight down to --min-lr (BERT's "
                  "fine-tuning schedule); wsd: hold --lr, then decay linearly to --min-lr over "
                  "the last --cooldown-frac of the run; constant; or inverse_sqrt: --lr * "
                  "sqrt(warmup / step), at least --min-lr (the Transformer's)")
    cooldown_frac: float = opt(0.2, "wsd: fraction of the run spent decaying")
    lr_decay_iters: Optional[int] = opt(None, "step where the decay ends (default: --max-iters)")
    weight_decay: float = opt(0.1, "AdamW decoupled weight decay (never on norms, biases, "
                                   "embeddings)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)")
    eval_interval: int = opt(250, "steps between evaluations (and checkpoints)")
    eval_iters: int = opt(40, "batches per split per evaluation")
    seed: int = opt(1337, "seed for initialisation, data order and dropout")
    threads: Optional[int] = opt(None, "torch intra-op threads (default: half the usable CPUs: "
                                       "all of them collapses beside another busy process)")
    kernels: Literal[KERNEL_SETS] = opt("ext", "our C++ kernels, or plain PyTorch ops")
    compile: bool = opt(False, "train through torch.compile (our ops compile unbroken)")
    device: str = opt("cpu", "torch device")
    dtype: Optional[Literal[DTYPES]] = opt(
        None, "number type of the matrix products: bfloat16 or float16 run under autocast, with "
              "loss scaling for float16 (weights, optimizer state and checkpoints stay float32); "
              "default bfloat16 on a CUDA device that supports it, else float32")

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("batch_size", "max_tokens", "grad_accum", "max_iters", "eval_interval",
                     "eval_iters", "threads", "lr_decay_iters"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_iters", "bleu_sentences"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise ValueError(f"epochs must be a number > 0, got {self.epochs}")
        if self.warmup_frac is not None and not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if not (math.isfinite(self.distill_temperature) and self.distill_temperature > 0):
            raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}")
        for name in ("cooldown_frac", "distill_alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
