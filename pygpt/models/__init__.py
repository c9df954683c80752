"""The model families, assembled from pygpt.nn, and `build(config)`, which picks one by the
config's `arch`: what checkpoints use, so that they never name a model class themselves."""
from __future__ import annotations

from torch import nn

from pygpt.config import ARCHS, ModelConfig
from pygpt.models.bert import BERT, BertOutput
from pygpt.models.gpt import GPT, GPTOutput
from pygpt.models.seq2seq import Seq2Seq, Seq2SeqOutput

MODELS: dict[str, type[nn.Module]] = {"gpt": GPT, "bert": BERT, "seq2seq": Seq2Seq}
assert tuple(MODELS) == ARCHS, "pygpt.config.ARCHS names these families"


def build(cfg: ModelConfig, kernels: str = "ext") -> nn.Module:
    """A freshly initialised model of the family cfg.arch names, on the given kernel set."""
    if cfg.arch not in MODELS:
        raise ValueError(f"unknown model family {cfg.arch!r}; choose from {', '.join(MODELS)}")
    return MODELS[cfg.arch](cfg, kernels=kernels)


__all__ = ["BERT", "BertOutput", "GPT", "GPTOutput", "MODELS", "Seq2Seq", "Seq2SeqOutput",
           "build"]
