"""The encoder-decoder translator (arch seq2seq): trained on sentence pairs in token-budget
batches (--src-data, --tgt-data), one joint vocabulary with [PAD] [UNK] [BOS] [EOS], translation
by beam search, and its export as an encoder and two decoder graphs (pygpt.onnx.seq2seq)."""
from __future__ import annotations

import shlex
import sys

from pygpt.onnx.seq2seq import export_seq2seq
from pygpt.families.base import TRANSLATION_FILES, Family, flag
from pygpt.data.common import IGNORE_INDEX
from pygpt.models import Seq2Seq
from pygpt.nn.distill_loss import LogitRows
from pygpt.tokenizer import SEQ2SEQ_SPECIALS
from pygpt.tasks.seq2seq import Translation, joint_text

PARTNERS = dict(zip(TRANSLATION_FILES, ("tgt_data", "src_data", "val_tgt", "val_src")))


class TranslatorFamily(Family):
    name = "seq2seq"
    model = Seq2Seq
    default_preset = "seq2seq"
    specials = SEQ2SEQ_SPECIALS

    def build(self, cfg, kernels="ext", train_cfg=None):
        model = super().build(cfg, kernels)
        if train_cfg is not None:
            model.label_smoothing = train_cfg.label_smoothing
        return model

    def check_settings(self, model_cfg, train_cfg, given):
        self.refuse_val_data(train_cfg)
        if train_cfg.data is not None or train_cfg.task != "pretrain":
            raise ValueError("--arch seq2seq trains on sentence pairs: --src-data and "
                             "--tgt-data, not --data or --task classify")
        if "batch_size" in given:
            raise ValueError("--arch seq2seq sizes its batches by tokens: --max-tokens, not "
                             "--batch-size")
        if train_cfg.tokenizer == "wordpiece":
            raise ValueError("--arch seq2seq takes --tokenizer bpe or char (a WordPiece has no "
                             "[BOS] and [EOS])")
        for name, partner in PARTNERS.items():
            if getattr(train_cfg, name) is not None and getattr(train_cfg, partner) is None:
                raise ValueError(f"{flag(name)} needs {flag(partner)}: sources and their "
                                 "translations come in two files, line for line")
        if train_cfg.src_data is None:
            raise ValueError("--arch seq2seq needs --src-data and --tgt-data: the source "
                             "sentences and their translations, line for line")

    def data_files(self, train_cfg):
        return [(flag(name), getattr(train_cfg, name)) for name in TRANSLATION_FILES
                if getattr(train_cfg, name) is not None]

    def tokenizer_text(self, train_cfg):
        return joint_text(train_cfg)  # joint over both sides

    def make_task(self, model_cfg, train_cfg, tokenizer, ranks, labels):
        """Pairs left out (empty, or too long for the model) are reported on stderr."""
        task = Translation.from_files(train_cfg, tokenizer, model_cfg.block_size)
        for name, corpus in task.splits.items():
            if ranks.is_main and (corpus.skipped_empty or corpus.skipped_long):
                print(f"note: {name} split: {corpus.summary}", file=sys.stderr)
        return task

    def distill_rows(self, model, batch, with_output):
        """The next-token logits at each real (unpadded) target position."""
        x = model.decode_features(batch["tgt_in"], model.encode(batch["src"], batch["src_lengths"]),
                                  batch["src_lengths"], tgt_lengths=batch["tgt_lengths"])
        rows = LogitRows(x[batch["tgt_out"] != IGNORE_INDEX], model.out.weight, model.out.bias)
        return (model.head(x, batch["tgt_out"]) if with_output else None), rows

    def export(self, model, tokenizer, labels, out_dir, quantize):
        return export_seq2seq(model, tokenizer, out_dir, quantize)

    def next_command(self, ckpt, model_cfg, train_cfg):
        return (f"python -m pygpt.translate --ckpt {shlex.quote(ckpt)} "
                "--text 'a sentence to translate'")


TRANSLATOR_FAMILY = TranslatorFamily()
