"""The BERT and translator models of `python -m pygpt.serve --ckpt`: a checkpoint's torch model
behind the interface the export server's task routes call (pygpt_runtime.serve.tasks, written
for onnx_bert.OnnxBERT and onnx_seq2seq.OnnxSeq2Seq), computed by the functions of pygpt's
own command lines (pygpt.fill_mask.fill_mask, pygpt.classify.classify_texts, pygpt.tag.tag_text,
pygpt.answer.answer, pygpt.decoding.translate_texts), so that each route answers what that
command prints. Each call
holds `lock`, which the attention route holds too (its hooks must see its own call only)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from pygpt.answer import answer, require_answerer
from pygpt.classify import classifier_labels, classify_texts
from pygpt.decoding.translate_texts import SPECIALS, translate_texts
from pygpt.families import family
from pygpt.fill_mask import fill_mask, require_mask_specials
from pygpt.models import BERT, Seq2Seq
from pygpt.serve.model_lock import ModelLock
from pygpt.tag import tag_text, tagger_labels
from pygpt.tasks.qa import SPAN_LABELS
from pygpt.tokenizer import Tokenizer, require_specials
from pygpt_runtime.answering import Prediction
from pygpt_runtime.onnx_search import Search
from pygpt_runtime.serve.served import Limits
from pygpt_runtime.serve.tasks import TaskQueue


class TorchBERT:
    """A BERT checkpoint's task, by its head: fill-mask (a pretraining), classify, tag or qa."""

    def __init__(self, ckpt: str, model: BERT, tokenizer: Tokenizer, lock: ModelLock):
        self.model, self.tokenizer, self.lock = model, tokenizer, lock
        head = family("bert").head_task(model.config)
        self.task = "fill-mask" if head == "pretrain" else head
        self.labels: Optional[list[str]] = None
        if self.task == "fill-mask":
            require_mask_specials(tokenizer)
        elif self.task == "classify":
            self.labels = classifier_labels(ckpt, model, tokenizer)
        elif self.task == "tag":
            self.labels = tagger_labels(ckpt, model, tokenizer)
        else:
            require_answerer(ckpt, model, tokenizer)
            self.labels = list(SPAN_LABELS)

    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """For each [MASK] in text, in order, the top_k (token, probability) pairs."""
        with self.lock:
            return fill_mask(self.model, self.tokenizer, text, top_k)

    def classify(self, texts: list[str], pairs: Optional[list[str]] = None) -> torch.Tensor:
        """The class probabilities (n, num_labels) of texts (with their pairs)."""
        with self.lock:
            return classify_texts(self.model, self.tokenizer, self.labels, texts, pairs, "text")

    def tag(self, text: str, where: str = "--text") -> list[tuple[str, int, int]]:
        """The entities of text, in order: (type, start, end), [start, end) its characters."""
        with self.lock:
            return tag_text(self.model, self.tokenizer, self.labels, text, where)

    def answer(self, question: str, context: str, no_answer: bool = False,
               threshold: float = 0.0, where: str = "--question") -> Prediction:
        """The answer to question in context (no_answer: it may be none)."""
        with self.lock:
            return answer(self.model, self.tokenizer, question, context, no_answer, threshold,
                          where)


class TorchTranslator:
    """A translator checkpoint's translate."""

    def __init__(self, model: Seq2Seq, tokenizer: Tokenizer, lock: ModelLock):
        require_specials(tokenizer.special_tokens, SPECIALS, "translation")
        self.model, self.tokenizer, self.lock = model, tokenizer, lock

    def translate(self, texts: Sequence[str], search: Search) -> list[str]:
        """The translations of texts, as python -m pygpt.translate gives them."""
        with self.lock:
            return translate_texts(self.model, self.tokenizer, texts, search)[0]


def open_bert(ckpt: str, model: BERT, tokenizer: Tokenizer, lock: ModelLock,
              limits: Limits) -> tuple[TorchBERT, TaskQueue, dict]:
    """A BERT checkpoint's opener (pygpt.serve.checkpoint.OPENERS): its task and labels, on
    the task worker."""
    bert = TorchBERT(ckpt, model, tokenizer, lock)
    return bert, TaskQueue(limits.queue_size), {"task": bert.task, "labels": bert.labels}


def open_translator(ckpt: str, model: Seq2Seq, tokenizer: Tokenizer, lock: ModelLock,
                    limits: Limits) -> tuple[TorchTranslator, TaskQueue, dict]:
    """A translator checkpoint's opener (pygpt.serve.checkpoint.OPENERS), on the task worker."""
    return TorchTranslator(model, tokenizer, lock), TaskQueue(limits.queue_size), {}
