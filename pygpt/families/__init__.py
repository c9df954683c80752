"""The model families, by the name a config's `arch` gives (pygpt.families.base says what a
family owns); `build(config)`, which checkpoints use so that they never name a model class; and
`attention_maps`, a model's attention for texts framed as its family frames them."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from pygpt.config import ARCHS, ModelConfig
from pygpt.families.base import Family
from pygpt.families.bert import BERT_FAMILY
from pygpt.families.gpt import GPT_FAMILY
from pygpt.families.seq2seq import SEQ2SEQ_FAMILY
from pygpt.inspect.attention_maps import AttentionMaps, maps_of
from pygpt.tokenizer import Tokenizer

FAMILIES: dict[str, Family] = {f.name: f for f in (GPT_FAMILY, BERT_FAMILY, SEQ2SEQ_FAMILY)}
assert tuple(FAMILIES) == ARCHS, "pygpt.config.ARCHS names these families"


def family(arch: str) -> Family:
    if arch not in FAMILIES:
        raise ValueError(f"unknown model family {arch!r}; choose from {', '.join(FAMILIES)}")
    return FAMILIES[arch]


def build(cfg: ModelConfig, kernels: str = "ext") -> nn.Module:
    """A freshly initialised model of the family cfg.arch names, on the given kernel set."""
    return family(cfg.arch).build(cfg, kernels=kernels)


@torch.inference_mode()
def attention_maps(model: nn.Module, tokenizer: Tokenizer, texts: Sequence[str],
                   targets: Optional[Sequence[Optional[str]]] = None) -> list[AttentionMaps]:
    """Every attention layer of model (any family's, in eval mode) for each text, the texts run
    as one right-padded batch and framed as its family frames them (Family.attention_inputs: a
    GPT reads a text's tokens, a BERT [CLS] text [SEP], a translator the text as its source and
    [BOS] + the target, None: its greedy translation). ValueError (one line) for an empty text,
    one too long for the model, or a character a char tokenizer lacks."""
    if not texts:
        raise ValueError("no texts")
    device = next(model.parameters()).device
    inputs = family(model.config.arch).attention_inputs(
        model, tokenizer, list(texts), None if targets is None else list(targets), device)
    return maps_of(model, tokenizer, inputs)


__all__ = ["FAMILIES", "Family", "attention_maps", "build", "family"]
