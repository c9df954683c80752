"""The training task of the encoder-decoder translator (arch seq2seq), on pygpt.tasks'
Task protocol: batches of sentence pairs by token budget (pygpt.data.parallel), and an
evaluation that reports the label-smoothed loss the model trains on, the plain per-token
cross-entropy (nll) with its perplexity, and next-token accuracy, all per target token.

Training batches: each split's pairs are bucketed once (a fixed order, batches of at most
max_tokens tokens counting padding), and each call draws one of those batches at random from the
generator given, so a batch is a function of the generator's state alone, as the loop's resume
requires (the loop saves that state only). Batches are thus drawn with replacement, never
walked epoch by epoch. `batch_size` is not used: max_tokens sets the size.

An evaluation passes over the whole validation set in order, and over `iters` random batches
of the training set. With bleu_sentences (and the tokenizer), `model_metrics(model)` also
translates the first bleu_sentences validation pairs by greedy decoding (pygpt.decoding.translate_texts)
and scores them against their targets with sacreBLEU (pygpt.tasks.bleu): val_bleu, val_bleu_lc
(lowercased) and val_chrf, plus `samples` of those translations (source, reference, output) as
val_samples; the subset is fixed, so the figures compare across evaluations.

A run's data (`from_files`, `joint_text`): the training files, and the validation files or else
a fixed pick of the training pairs (1 in 20, at most 2000, by a fixed seed, so a resumed run
holds out the same ones); the joint vocabulary is learned from every line of both training
files. Ranks cannot slice a token-budget batch by rows as the other tasks' batches (`by_tokens`):
the loop gives each rank its own draw instead.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F

from pygpt.tasks.bleu import score
from pygpt.config import TrainConfig
from pygpt.data.common import IGNORE_INDEX
from pygpt.data.parallel import (ParallelCorpus, TranslationBatch, bucket_batches, read_lines,
                                 read_pairs)
from pygpt.decoding.translate_texts import translate_ids
from pygpt.tasks import Metrics, TaskDefaults
from pygpt.decoding.beam_search import Search

BUCKETING_SEED = 0  # the fixed order each split's batches are cut in
HELD_OUT_EVERY, HELD_OUT_MOST, HELD_OUT_SEED = 20, 2000, 0  # validation without --val-src


def joint_text(cfg: TrainConfig) -> Iterator[str]:
    """The lines of both training files, each ending in a line break: the tokenizer's text."""
    for path in (cfg.src_data, cfg.tgt_data):
        yield from (line + "\n" for line in read_lines(path))


def held_out(n: int) -> np.ndarray:
    """Which of n training pairs are held out for validation (a mask; module docstring)."""
    if n < 2:
        raise ValueError(f"{n} sentence pair(s) are too few to hold some out for validation; "
                         "give --val-src and --val-tgt")
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    mask = np.zeros(n, dtype=bool)
    mask[pick[:max(1, min(HELD_OUT_MOST, n // HELD_OUT_EVERY))].numpy()] = True
    return mask


class Translation(TaskDefaults):
    by_tokens = True  # batches sized by max_tokens: not to be sliced by rows

    def __init__(self, train: ParallelCorpus, val: ParallelCorpus, max_tokens: int,
                 tokenizer: Any = None, bleu_sentences: int = 0, samples: int = 3,
                 label_smoothing: float = 0.0):
        self.splits = {"train": train, "val": val}
        for name, corpus in self.splits.items():
            if not len(corpus):
                raise ValueError(f"the {name} split holds no sentence pairs")
        if bleu_sentences < 0 or samples < 0:
            raise ValueError(f"bleu_sentences and samples must not be negative, got "
                             f"{bleu_sentences} and {samples}")
        if bleu_sentences and tokenizer is None:
            raise ValueError("validation BLEU (bleu_sentences) needs the tokenizer")
        self.max_tokens, self.label_smoothing = max_tokens, label_smoothing
        self.tokenizer, self.samples = tokenizer, samples
        self.bleu_pairs = range(min(bleu_sentences, len(val)))
        self.buckets = {name: bucket_batches(*corpus.lengths(), max_tokens,
                                             torch.Generator().manual_seed(BUCKETING_SEED))
                        for name, corpus in self.splits.items()}

    @classmethod
    def from_files(cls, cfg: TrainConfig, tokenizer: Any, block_size: int) -> "Translation":
        """The run's splits (module docstring) under tokenizer, for a model of block_size
        positions (pairs with a side over block_size - 1 tokens are skipped)."""
        max_len = block_size - 1
        if cfg.val_src is not None:
            train = ParallelCorpus.from_files(cfg.src_data, cfg.tgt_data, tokenizer, max_len)
            val = ParallelCorpus.from_files(cfg.val_src, cfg.val_tgt, tokenizer, max_len)
        else:
            pairs = list(read_pairs(cfg.src_data, cfg.tgt_data))
            mask = held_out(len(pairs))
            train, val = (ParallelCorpus.from_pairs(
                (p for p, held in zip(pairs, mask) if held == want), tokenizer.encode,
                tokenizer.special_tokens, max_len) for want in (False, True))
            for name, corpus in (("training", train), ("held-out validation", val)):
                if not len(corpus):
                    raise ValueError(f"{cfg.src_data} and {cfg.tgt_data} leave no usable "
                                     f"{name} pairs ({corpus.summary})")
        return cls(train, val, cfg.max_tokens, tokenizer, cfg.bleu_sentences,
                   label_smoothing=cfg.label_smoothing)

    def batch(self, split: str, batch_size: int,
              generator: Optional[torch.Generator] = None) -> TranslationBatch:
        buckets = self.buckets[split]
        k = int(torch.randint(len(buckets), (1,), generator=generator))
        return self.splits[split].batch(buckets[k])

    def eval_batches(self, split: str, batch_size: int, generator: torch.Generator,
                     iters: int) -> Iterable[TranslationBatch]:
        if split == "val":
            return self.splits["val"].batches(self.max_tokens)
        return (self.batch(split, batch_size, generator) for _ in range(iters))

    def inputs(self, batch: TranslationBatch) -> dict[str, Any]:
        """The batch, and the label smoothing of the training loss (--label-smoothing)."""
        return {**batch._asdict(), "label_smoothing": self.label_smoothing}

    def summary(self) -> str:
        train, val = (len(self.splits[s]) for s in ("train", "val"))
        return f"{train:,} training and {val:,} validation sentence pairs"

    def tokens(self, batch: TranslationBatch) -> int:
        """Real tokens on both sides ([BOS] included)."""
        return int(batch.src_lengths.sum() + batch.tgt_lengths.sum())

    def metrics(self, output, batch: TranslationBatch) -> Metrics:
        real = batch.tgt_out != IGNORE_INDEX
        logits, targets = output.logits[real].float(), batch.tgt_out[real]
        n = targets.numel()
        nll = F.cross_entropy(logits, targets, reduction="sum").item()
        correct = (logits.argmax(-1) == targets).sum().item()
        return {"loss": (output.loss.item() * n, n), "nll": (nll, n), "acc": (correct, n)}

    def summarise(self, means: dict[str, float]) -> dict[str, float]:
        return {**means, "ppl": math.exp(means["nll"])}

    def model_metrics(self, model) -> dict[str, Any]:
        """Validation BLEU on the fixed subset (module docstring); {} without one."""
        if not self.bleu_pairs:
            return {}
        val, decode = self.splits["val"], self.tokenizer.decode
        sources = [val.src.line(i).tolist() for i in self.bleu_pairs]
        refs = [decode(val.tgt.line(i).tolist()) for i in self.bleu_pairs]
        hyps = [decode(ids) for ids in translate_ids(model, sources, self.tokenizer.special_tokens,
                                                     Search(beam=1)).ids]
        bleu, bleu_lc, chrf = score(hyps, refs)
        samples = [{"source": decode(s), "reference": r, "translation": h}
                   for s, r, h in list(zip(sources, refs, hyps))[:self.samples]]
        return {"val_bleu": bleu, "val_bleu_lc": bleu_lc, "val_chrf": chrf,
                "val_samples": samples}

    def describe(self, record: dict) -> str:
        bleu = f", BLEU {record['val_bleu']:.2f}" if "val_bleu" in record else ""
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(nll {record['val_nll']:.4f}, ppl {record['val_ppl']:.2f}, token acc "
                f"{record['val_acc']:.3f}{bleu})")
