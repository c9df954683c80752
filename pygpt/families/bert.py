"""The encoder-only BERT: masked-LM (and next-sentence) pretraining on a text, fine-tuning to
classify labelled texts (--task classify), to tag named entities in CoNLL sentences (--task
tag) or to answer questions from a context in SQuAD files (--task qa), fill-mask, and its export
as one encoder graph (pygpt.onnx.bert)."""
from __future__ import annotations

import dataclasses
import shlex

import torch

from pygpt.onnx.bert import export_bert
from pygpt.families.base import Family
from pygpt_runtime.conll import read_conll
from pygpt.data.labelled import read_labelled
from pygpt.data.mlm import MLMBatches
from pygpt_runtime.squad import questions_of, read_squad
from pygpt.data.common import IGNORE_INDEX
from pygpt.inspect.attention_maps import MapInputs, batch_rows, encode_text
from pygpt.models import BERT
from pygpt.nn.distill_loss import LogitRows
from pygpt.tasks import TOKEN_HEADS, Classification, MaskedLanguageModelling
from pygpt.tasks.qa import QuestionAnswering
from pygpt.tasks.tagging import Tagging
from pygpt.tokenizer import require_specials

# The preset of each fine-tuning task and what its --data holds.
FINE_TUNING = {"classify": ("bert-classify", "a TSV or CSV file with label and text columns"),
               "tag": ("bert-tag", "a CoNLL file, a word and its BIO tag a line"),
               "qa": ("bert-qa", "a SQuAD v1.1 or v2.0 JSON file")}
# The tasks whose head reads each token, and their pooling (every other task's reads one vector
# a row).
TOKEN_POOLING = {head.task: pooling for pooling, head in TOKEN_HEADS.items()}


class BERTFamily(Family):
    name = "bert"
    model = BERT
    default_preset = "bert-baby"
    tasks = ("pretrain", "classify", "tag", "qa")
    specials = True  # [PAD] [UNK] [CLS] [SEP] [MASK]
    text_specials = ("[CLS]", "[SEP]")
    # A fine-tuned MiniLM tagger lost 8.5 points of entity F1 with one scale per tensor and none
    # per channel (docs/results.md, "Fine-tuning an imported encoder").
    int8_per_channel = True

    def preset_for(self, task, pretrained=False):
        if task not in FINE_TUNING:
            return self.default_preset
        return FINE_TUNING[task][0] + ("-pretrained" if pretrained else "")

    def head_task(self, model_cfg):
        if not model_cfg.num_labels:
            return "pretrain"
        return next((task for task, pooling in TOKEN_POOLING.items()
                     if model_cfg.pooling == pooling), "classify")

    def check_settings(self, model_cfg, train_cfg, given):
        super().check_settings(model_cfg, train_cfg, given)
        task = train_cfg.task
        if task not in FINE_TUNING:
            return
        if "num_labels" in given:
            raise ValueError(f"--task {task} takes the number of classes from the labels in "
                             "--data; --num-labels cannot set it")
        if train_cfg.data is None:
            raise ValueError(f"--task {task} needs --data: {FINE_TUNING[task][1]}")
        if TOKEN_POOLING.get(task) != model_cfg.pooling and (
                task in TOKEN_POOLING or model_cfg.pooling in TOKEN_POOLING.values()):
            raise ValueError(f"--pooling {model_cfg.pooling} does not fit --task {task}: "
                             "pooling token (a label per token) is --task tag's, pooling span "
                             "(an answer's start and end) --task qa's, and only theirs")

    def prepare_config(self, model_cfg, train_cfg, task, source_labels):
        """A classifier's head sized by its data's labels; pretraining a classifier further
        keeps the labels of the run it continues or fine-tunes."""
        if task.labels is not None:
            return dataclasses.replace(model_cfg, num_labels=len(task.labels)), task.labels
        if not model_cfg.num_labels:
            return model_cfg, None
        if source_labels is None:
            raise ValueError(f"num_labels {model_cfg.num_labels} without labels: --task "
                             "classify sets it from the data's labels, and pretraining keeps "
                             "the labels of an --init-from or --resume classifier")
        return model_cfg, source_labels()

    def data_files(self, train_cfg):
        files = [("--data", train_cfg.data)]
        return files + ([("--val-data", train_cfg.val_data)] if train_cfg.val_data else [])

    def tokenizer_text(self, train_cfg):
        if train_cfg.task == "pretrain":
            return super().tokenizer_text(train_cfg)
        if train_cfg.task == "tag":  # a tagger's tokenizer (trained from scratch): its words
            return ["\n".join(" ".join(s.words) for s in read_conll(train_cfg.data).sentences)]
        if train_cfg.task == "qa":  # a question answerer's: its contexts and questions
            paragraphs = read_squad(train_cfg.data)
            return ["\n".join([p.context for p in paragraphs]
                              + [q.question for q in questions_of(paragraphs)])]
        # A classifier's tokenizer (trained from scratch): its texts.
        return ["\n".join(t for e in read_labelled(train_cfg.data) for t in (e.text, e.text_pair)
                          if t)]

    def make_task(self, model_cfg, train_cfg, tokenizer, ranks, labels):
        if train_cfg.task == "classify":
            return Classification.from_files(train_cfg.data, train_cfg.val_data, tokenizer,
                                             model_cfg.block_size, labels)
        if train_cfg.task == "tag":
            return Tagging.from_files(train_cfg.data, train_cfg.val_data, tokenizer,
                                      model_cfg.block_size, labels)
        if train_cfg.task == "qa":
            return QuestionAnswering.from_files(train_cfg.data, train_cfg.val_data, tokenizer,
                                                model_cfg.block_size, labels)
        return MaskedLanguageModelling(MLMBatches.from_file(train_cfg.data, tokenizer,
                                                            model_cfg.block_size,
                                                            nsp=model_cfg.nsp))

    def distill_rows(self, model, batch, with_output):
        """A classifier's logits (classification), or the masked-LM head's at the masked
        positions (pretraining; next-sentence prediction is not distilled)."""
        if "labels" in batch:
            output = model(**batch)
            return (output if with_output else None), LogitRows(output.logits)
        h = model.encode(batch["input_ids"], batch["segment_ids"], batch["lengths"])
        masked = model.mlm.features(h[batch["mlm_labels"] != IGNORE_INDEX])
        rows = LogitRows(masked, model.mlm.decoder.weight, model.mlm.decoder.bias)
        return (model.heads(h, batch["lengths"], batch["mlm_labels"], batch["nsp_labels"])
                if with_output else None), rows

    def attention_inputs(self, model, tokenizer, texts, targets, device):
        """[CLS] text [SEP] through the encoder ("[MASK]" and "[SEP]" in a text are those
        tokens). A text that holds a [SEP] is a pair ("question [SEP] context"), read as the
        pair tasks read theirs: segment B from after its first [SEP] to the end."""
        specials = tokenizer.special_tokens
        require_specials(specials, (*self.text_specials, *tokenizer.encoding_needs),
                         "BERT inputs")
        first, last = (specials[name] for name in self.text_specials)
        rows = [encode_text(tokenizer, t, model.config.block_size, "text", specials=True,
                            before=[first], after=[last]) for t in texts]
        ids, lengths = batch_rows(rows, specials.get("[PAD]", 0), device)
        segments = torch.zeros_like(ids)
        if model.config.type_vocab_size > 1:
            for b, row in enumerate(rows):
                segments[b, row.index(last) + 1:len(row)] = 1
        return MapInputs(rows, [], self.attention_layers(model),
                         lambda: model.encode(ids, segments, lengths))

    def export(self, model, tokenizer, labels, out_dir, quantize):
        return export_bert(model, tokenizer, labels, out_dir, quantize)

    def next_command(self, ckpt, model_cfg, train_cfg):
        if train_cfg.task == "qa" or model_cfg.num_labels and model_cfg.pooling == "span":
            return (f"python -m pygpt.answer --ckpt {shlex.quote(ckpt)} --question 'Where did "
                    "Peter fly?' --context 'Peter Blackburn flew to Brussels.'")
        if train_cfg.task == "tag" or model_cfg.num_labels and model_cfg.pooling == "token":
            return (f"python -m pygpt.tag --ckpt {shlex.quote(ckpt)} "
                    "--text 'Peter Blackburn flew to Brussels'")
        if train_cfg.task == "classify" or model_cfg.num_labels:
            return (f"python -m pygpt.classify --ckpt {shlex.quote(ckpt)} "
                    "--text 'a text to classify'")
        return (f"python -m pygpt.fill_mask --ckpt {shlex.quote(ckpt)} "
                "--text 'To be, or not to be: that is the [MASK]'")


BERT_FAMILY = BERTFamily()
