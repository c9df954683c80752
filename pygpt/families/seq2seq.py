"""The encoder-decoder translator (arch seq2seq): trained on sentence pairs in token-budget
batches (--src-data, --tgt-data), one joint vocabulary with [PAD] [UNK] [BOS] [EOS], translation
by beam search, and its export as an encoder and two decoder graphs (pygpt.onnx.seq2seq)."""
from __future__ import annotations

import shlex
import sys

import torch

from pygpt.onnx.seq2seq import export_seq2seq
from pygpt.families.base import Family, flag
from pygpt.data.common import IGNORE_INDEX
from pygpt.decoding.beam_search import translate
from pygpt.decoding.translate_texts import SPECIALS
from pygpt.inspect.attention_maps import MapInputs, batch_rows, encode_text
from pygpt.models import Seq2Seq
from pygpt.nn.distill_loss import LogitRows
from pygpt.tokenizer import SEQ2SEQ_SPECIALS, require_specials
from pygpt_runtime.onnx_search import Search
from pygpt.tasks.seq2seq import Translation, joint_text

# The files a translator reads (instead of --data), each with the one that pairs with it.
PARTNERS = {"src_data": "tgt_data", "tgt_data": "src_data", "val_src": "val_tgt",
            "val_tgt": "val_src"}


class Seq2SeqFamily(Family):
    name = "seq2seq"
    model = Seq2Seq
    default_preset = "seq2seq"
    specials = SEQ2SEQ_SPECIALS
    trains_on = "sentence pairs (--src-data, --tgt-data) in batches of --max-tokens tokens"
    attention_parts = ("encoder", "decoder", "cross")
    default_attention_part = "cross"  # a trained translator's shows the word alignment
    has_target = True

    def check_settings(self, model_cfg, train_cfg, given):
        super().check_settings(model_cfg, train_cfg, given)
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
        return [(flag(name), getattr(train_cfg, name)) for name in PARTNERS
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
        return (model.head(x, batch["tgt_out"], batch.get("label_smoothing", 0.0))
                if with_output else None), rows

    def attention_layers(self, model):
        return {"encoder": [b.attn for b in model.encoder],
                "decoder": [b.attn for b in model.decoder],
                "cross": [b.cross for b in model.decoder]}

    def attention_inputs(self, model, tokenizer, texts, targets, device):
        """Each text as the source, and [BOS] + its target as the decoder's input: the target
        given, or else the model's greedy translation, cut to what the decoder read."""
        most = model.config.block_size
        require_specials(tokenizer.special_tokens, SPECIALS, "translation")
        pad, bos, eos = (tokenizer.special_tokens[name] for name in SPECIALS)
        sources = [encode_text(tokenizer, t, most, "text") for t in texts]
        src, src_lengths = batch_rows(sources, pad, device)
        given = list(targets) if targets is not None else [None] * len(texts)
        if len(given) != len(texts):
            raise ValueError(f"{len(given)} targets for {len(texts)} texts")
        greedy = [[]] * len(texts)
        if any(t is None for t in given):
            lengths = torch.tensor([len(s) for s in sources], device=device)
            greedy = translate(model, src, lengths, bos=bos, eos=eos, search=Search(beam=1),
                               banned=(pad, bos))
        decoder_inputs = []
        for target, translation in zip(given, greedy):
            ids = [bos, *(tokenizer.encode(target) if target is not None
                          else translation[:model.max_target_length - 1])]
            if len(ids) > model.max_target_length:
                raise ValueError(f"the target is {len(ids)} tokens with [BOS]; the model's "
                                 f"decoder takes at most {model.max_target_length}")
            decoder_inputs.append(ids)
        tgt_in, tgt_lengths = batch_rows(decoder_inputs, pad, device)
        return MapInputs(sources, decoder_inputs, self.attention_layers(model),
                         lambda: model(src, src_lengths, tgt_in, tgt_lengths=tgt_lengths))

    def export(self, model, tokenizer, labels, out_dir, quantize):
        return export_seq2seq(model, tokenizer, out_dir, quantize)

    def next_command(self, ckpt, model_cfg, train_cfg):
        return (f"python -m pygpt.translate --ckpt {shlex.quote(ckpt)} "
                "--text 'a sentence to translate'")


SEQ2SEQ_FAMILY = Seq2SeqFamily()
