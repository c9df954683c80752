"""The model families, by the name a config's `arch` gives (pygpt.families.base says what a
family owns), and `build(config)`, which checkpoints use so that they never name a model class."""
from __future__ import annotations

from torch import nn

from pygpt.config import ARCHS, ModelConfig
from pygpt.families.base import Family
from pygpt.families.bert import BERT_FAMILY
from pygpt.families.gpt import GPT_FAMILY
from pygpt.families.seq2seq import TRANSLATOR_FAMILY

FAMILIES: dict[str, Family] = {f.name: f for f in (GPT_FAMILY, BERT_FAMILY, TRANSLATOR_FAMILY)}
assert tuple(FAMILIES) == ARCHS, "pygpt.config.ARCHS names these families"


def family(arch: str) -> Family:
    if arch not in FAMILIES:
        raise ValueError(f"unknown model family {arch!r}; choose from {', '.join(FAMILIES)}")
    return FAMILIES[arch]


def build(cfg: ModelConfig, kernels: str = "ext") -> nn.Module:
    """A freshly initialised model of the family cfg.arch names, on the given kernel set."""
    return family(cfg.arch).build(cfg, kernels=kernels)


__all__ = ["FAMILIES", "Family", "build", "family"]
