"""BERT (`transformers`' BertModel, BertForMaskedLM, BertForPreTraining,
BertForSequenceClassification, BertForTokenClassification and BertForQuestionAnswering) as
pygpt's BERT, both ways.

pygpt's BERT with post-norm blocks, a layer norm after the embeddings, learned absolute
positions and segment embeddings is BERT's architecture. Where they differ in storage:
- BERT's separate query, key and value layers stack by rows into our fused `qkv`;
- the masked-LM head's decoder bias is `cls.predictions.bias`, its decoder weight the word
  embedding (tied), unless tie_word_embeddings is false (mlm_maps);
- `layer_norm_eps` (1e-12 in BERT) is our norm_eps.
pygpt's BERT always holds a pooler and a masked-LM head. A folder without them (BertModel, as
sentence-embedding models ship it, possibly without its pooler; BertForMaskedLM, which has no
pooler; BertForSequenceClassification, which has no masked-LM head; BertForTokenClassification
and BertForQuestionAnswering, which have neither) gets them freshly
initialised, as `transformers` does when a model class adds a head: the tensors the folder holds
give the same logits. An export writes only what the target class holds: BertForPreTraining
(pygpt's next-sentence head on), BertForMaskedLM (off), BertForSequenceClassification (a
classifier, with id2label) or BertForTokenClassification (an entity tagger, pooling "token",
with id2label: its tags) or BertForQuestionAnswering (a question answerer, pooling "span"); a
pooler or masked-LM head the class lacks is not written. Both classifiers are dropout and one
linear map named `classifier`; the architecture in config.json says whether it reads the pooled
[CLS] or each token. The question answerer's `qa_outputs` is our classifier's linear map (two
outputs a token, start and end; its labels are pygpt.tasks.qa's SPAN_LABELS, not id2label's).
Refused, naming the field: relative position_embedding_type, a decoder or cross-attention, an
activation other than GELU (exact or tanh), an MLP not 4x wide, regression or multi-label problem types,
BertForQuestionAnswering without qa_outputs (or weights with it under another class), a
qa_outputs of other than two outputs; and on export pygpt's options BERT lacks (pre-norm, rotary, ALiBi, relative positions, mean pooling)."""
from __future__ import annotations

from typing import Any, Optional

from pygpt.config import ModelConfig
from pygpt.data.labelled import check_labels
from pygpt.tasks.qa import SPAN_LABELS
from pygpt.hf.mapping import (Layout, TensorMap, check_architectures, head_width_reasons,
                              layer_size_reasons, linear, refuse, setting, stacked)

MODEL_TYPE = "bert"
TOKEN_CLASSIFIER = "BertForTokenClassification"
QUESTION_ANSWERING = "BertForQuestionAnswering"
ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining",
                 "BertForSequenceClassification", TOKEN_CLASSIFIER, QUESTION_ANSWERING)
PREFIX = "bert."  # the task classes' name for the BertModel inside them
MLM, NSP, CLASSIFIER, POOLER = ("cls.predictions.", "cls.seq_relationship.", "classifier.",
                                "pooler.")
QA_OUTPUTS = "qa_outputs"  # BertForQuestionAnswering's start/end map
SINGLE_LABEL = (None, "single_label_classification")
# BERT's hidden_act names -> pygpt's activation (its MLP's and its masked-LM head's).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


def encoder_maps(cfg: ModelConfig, p: str, pooler: bool) -> list[TensorMap]:
    """The maps of BertModel's tensors (names under the prefix p)."""
    e = f"{p}embeddings."
    maps = [TensorMap("embed.tok.weight", (f"{e}word_embeddings.weight",)),
            TensorMap("embed.pos.weight", (f"{e}position_embeddings.weight",)),
            TensorMap("embed.seg.weight", (f"{e}token_type_embeddings.weight",)),
            *linear("embed.norm", f"{e}LayerNorm")]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}.", f"{p}encoder.layer.{i}."
        maps += (stacked(ours + "attn.qkv", tuple(f"{theirs}attention.self.{part}"
                                                  for part in ("query", "key", "value")))
                 + linear(ours + "attn.proj", theirs + "attention.output.dense")
                 + linear(ours + "attn_norm", theirs + "attention.output.LayerNorm")
                 + linear(ours + "mlp.fc", theirs + "intermediate.dense")
                 + linear(ours + "mlp.proj", theirs + "output.dense")
                 + linear(ours + "mlp_norm", theirs + "output.LayerNorm"))
    return maps + (linear("pooler", f"{p}{POOLER}dense") if pooler else [])


def mlm_maps(cfg: ModelConfig) -> list[TensorMap]:
    """The masked-LM head's maps. Tied, the decoder's bias is `cls.predictions.bias`; untied,
    transformers' decoder has its own weight and bias (and the head's `bias` goes unused)."""
    maps = (linear("mlm.transform", f"{MLM}transform.dense")
            + linear("mlm.norm", f"{MLM}transform.LayerNorm"))
    if cfg.tie_weights:
        return maps + [TensorMap("mlm.decoder.bias", (f"{MLM}bias",))]
    return maps + linear("mlm.decoder", f"{MLM}decoder")


def import_layout(hf: dict[str, Any], names: set[str]) -> Layout:
    """The pygpt BERT of a BERT config.json whose weights file holds the tensors `names`."""
    check_architectures(hf, ARCHITECTURES)
    architectures = setting(hf, "architectures", None, list) or []
    hidden = setting(hf, "hidden_size", 768, int)
    reasons = []
    position = setting(hf, "position_embedding_type", "absolute", str)
    if position != "absolute":
        reasons.append(f"position_embedding_type is {position!r} (pygpt's BERT learns absolute "
                       "positions)")
    for name in ("is_decoder", "add_cross_attention"):
        if setting(hf, name, False, bool):
            reasons.append(f"{name} is true (pygpt's BERT is an encoder)")
    activation = setting(hf, "hidden_act", "gelu", str)
    if activation not in ACTIVATIONS:
        reasons.append(f"hidden_act is {activation!r} (pygpt's BERT has {', '.join(ACTIVATIONS)})")
    intermediate = setting(hf, "intermediate_size", 3072, int)
    if intermediate < 1:
        reasons.append(f"intermediate_size is {intermediate} (an MLP needs a positive width)")
    classifier = "classifier.weight" in names
    if classifier and setting(hf, "problem_type", None, str) not in SINGLE_LABEL:
        reasons.append(f"problem_type is {hf['problem_type']!r} (pygpt classifies into one "
                       "label)")
    answerer = f"{QA_OUTPUTS}.weight" in names
    if (QUESTION_ANSWERING in architectures) != answerer:
        reasons.append(f"the weights hold {'' if answerer else 'no '}{QA_OUTPUTS} (the "
                       f"question answerer's head), the architectures {architectures}")
    outputs = len(setting(hf, "id2label", None, dict) or range(2))  # transformers' num_labels
    if answerer and outputs != 2:
        reasons.append(f"id2label has {outputs} labels (a question answerer's qa_outputs gives "
                       "two a token: start and end)")
    refuse("this BERT", reasons)
    labels = label_names(hf) if classifier else SPAN_LABELS if answerer else None
    prefix = PREFIX if any(n.startswith(PREFIX) for n in names) else ""
    tie = setting(hf, "tie_word_embeddings", True, bool)
    try:
        cfg = ModelConfig(
            arch="bert", vocab_size=setting(hf, "vocab_size", 30522, int),
            block_size=setting(hf, "max_position_embeddings", 512, int),
            n_layer=setting(hf, "num_hidden_layers", 12, int),
            n_head=setting(hf, "num_attention_heads", 12, int), n_embd=hidden,
            mlp_dim=0 if intermediate == 4 * hidden else intermediate,
            dropout=setting(hf, "hidden_dropout_prob", 0.1, float), norm="post",
            activation=ACTIVATIONS[activation],
            embed_norm=True, final_norm=False, tie_weights=tie,
            norm_eps=setting(hf, "layer_norm_eps", 1e-12, float),
            type_vocab_size=setting(hf, "type_vocab_size", 2, int),
            nsp=f"{NSP}weight" in names, num_labels=len(labels or ()),
            pooling=("token" if TOKEN_CLASSIFIER in architectures else "span" if answerer
                     else "cls"))
    except ValueError as e:
        raise ValueError(f"config.json: {e}") from None
    pooler = f"{prefix}{POOLER}dense.weight" in names
    mlm = f"{MLM}transform.dense.weight" in names
    maps = encoder_maps(cfg, prefix, pooler) + (mlm_maps(cfg) if mlm else [])
    if cfg.nsp:
        maps += linear("nsp", f"{NSP[:-1]}")
    if classifier or answerer:
        maps += linear("classifier.1", CLASSIFIER[:-1] if classifier else QA_OUTPUTS)
    fresh = tuple(name for name, present in (("pooler.", pooler), ("mlm.", mlm)) if not present)
    # Buffers older versions saved; the decoder's tied copies of the embedding and the bias.
    ignored = {f"{prefix}embeddings.position_ids", f"{prefix}embeddings.token_type_ids",
               *([f"{MLM}decoder.weight", f"{MLM}decoder.bias"] if tie else [f"{MLM}bias"])}
    return Layout(cfg, maps, ignored, fresh)


def head_labels(hf: dict[str, Any], cfg: ModelConfig) -> list[str]:
    """The labels of the imported model cfg's head: a question answerer's SPAN_LABELS, a
    classifier's id2label (label_names)."""
    return SPAN_LABELS if cfg.pooling == "span" else label_names(hf)


def label_names(hf: dict[str, Any]) -> list[str]:
    """A classifier's class names in the order of its outputs, from id2label."""
    id2label = setting(hf, "id2label", None, dict)
    if not id2label:
        raise ValueError("config.json: a classifier needs id2label (its class names)")
    try:
        by_id = {int(i): name for i, name in id2label.items()}
    except ValueError:
        raise ValueError("config.json: id2label's keys must be the ids 0, 1, ...") from None
    if sorted(by_id) != list(range(len(by_id))) or not all(isinstance(n, str)
                                                           for n in by_id.values()):
        raise ValueError("config.json: id2label must name each id 0 .. num_labels - 1 once")
    labels = [by_id[i] for i in range(len(by_id))]
    check_labels(labels, "config.json: id2label")
    return labels


def export_mlm_maps(cfg: ModelConfig) -> list[TensorMap]:
    """mlm_maps, and untied the head's unused `bias` too (transformers expects it), written as
    the decoder's bias: what transformers before 5.0, which tied those two always, holds."""
    return mlm_maps(cfg) + ([] if cfg.tie_weights else [TensorMap("mlm.decoder.bias",
                                                                  (f"{MLM}bias",))])


def export_config(cfg: ModelConfig, special_tokens: dict[str, int],
                  labels: Optional[list[str]]) -> tuple[dict[str, Any], list[TensorMap]]:
    """The config.json of the BERT class that holds the model cfg (module docstring), and its
    tensor maps; a ValueError naming each option BERT cannot represent."""
    reasons = []
    if cfg.pos_encoding != "learned":
        reasons.append(f"pos_encoding is {cfg.pos_encoding!r} (BERT learns absolute positions)")
    if cfg.norm != "post":
        reasons.append(f"norm is {cfg.norm!r} (BERT is post-norm)")
    reasons += head_width_reasons(cfg) + layer_size_reasons(cfg)
    for name, why in (("embed_norm", "BERT normalises its embeddings"),
                      ("bias", "BERT's projections have biases"), ("mlp", "BERT's blocks have one"),
                      ("attn_proj", "the seed preset's switch"),
                      ("residual", "the seed preset's switch"),
                      ("block_norm", "the seed preset's switch")):
        if not getattr(cfg, name):
            reasons.append(f"{name} is off ({why})")
    if cfg.final_norm:
        reasons.append("final_norm is on (a post-norm BERT has no final norm)")
    if cfg.activation not in TO_HF_ACTIVATION:
        reasons.append(f"activation is {cfg.activation!r} (pygpt's BERT head has GELU only)")
    if cfg.num_labels and cfg.pooling == "mean":
        reasons.append("pooling is 'mean' (BERT's classifier reads the pooled [CLS] or each "
                       "token)")
    if cfg.type_vocab_size < 1:
        reasons.append("type_vocab_size is 0 (BERT has segment embeddings)")
    refuse("this BERT to Hugging Face", reasons)
    hf: dict[str, Any] = {
        "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "intermediate_size": cfg.mlp_width,
        "hidden_act": TO_HF_ACTIVATION.get(cfg.activation),
        "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": cfg.block_size, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "initializer_range": 0.02,
        "position_embedding_type": "absolute", "tie_word_embeddings": cfg.tie_weights,
        "pad_token_id": special_tokens.get("[PAD]", 0), "dtype": "float32"}
    if cfg.num_labels and cfg.pooling == "span":
        hf["architectures"] = [QUESTION_ANSWERING]
        maps = encoder_maps(cfg, PREFIX, False) + linear("classifier.1", QA_OUTPUTS)
    elif cfg.num_labels and cfg.pooling == "token":
        hf.update(architectures=[TOKEN_CLASSIFIER], id2label=dict(enumerate(labels)),
                  label2id={n: i for i, n in enumerate(labels)})
        maps = encoder_maps(cfg, PREFIX, False) + linear("classifier.1", CLASSIFIER[:-1])
    elif cfg.num_labels:
        hf.update(architectures=["BertForSequenceClassification"],
                  id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)},
                  problem_type="single_label_classification")
        maps = encoder_maps(cfg, PREFIX, True) + linear("classifier.1", CLASSIFIER[:-1])
    elif cfg.nsp:
        hf["architectures"] = ["BertForPreTraining"]
        maps = encoder_maps(cfg, PREFIX, True) + export_mlm_maps(cfg) + linear("nsp", NSP[:-1])
    else:
        hf["architectures"] = ["BertForMaskedLM"]
        maps = encoder_maps(cfg, PREFIX, False) + export_mlm_maps(cfg)
    return hf, maps
