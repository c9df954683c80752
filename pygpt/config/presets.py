"""The named starting points of a run (`python -m pygpt.train --preset NAME`): a ModelConfig and a
TrainConfig each (which one a run takes when --preset is not given is its family's choice:
pygpt.families)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pygpt.config import ModelConfig, TrainConfig


@dataclass
class Preset:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def bert_fine_tuning(task: str, pooling: str, nsp: bool = True, block_size: int = 64) -> Preset:
    """The preset of a BERT fine-tuning task: bert-baby's shape, its head reading `pooling`,
    a lower rate than pretraining, short warmup and cosine decay, light weight decay, an
    evaluation every 50 steps."""
    return Preset(ModelConfig(arch="bert", vocab_size=2000, block_size=block_size, n_layer=4,
                              n_head=4, n_embd=128, dropout=0.1, norm="post", embed_norm=True,
                              final_norm=False, nsp=nsp, pooling=pooling),
                  TrainConfig(tokenizer="wordpiece", task=task, batch_size=32, lr=5e-4,
                              warmup_iters=30, schedule="cosine", weight_decay=0.01,
                              max_iters=600, eval_interval=50, eval_iters=10))


# Fine-tuning a pretrained encoder (--init-from an import or a trained run; --task classify, tag
# or qa; no --preset): BERT's own recipe (Devlin et al. 2019, appendix A.3, also the defaults of
# transformers' run_glue / run_ner / run_qa): AdamW with beta2 0.999 and weight decay 0.01, 10%
# linear warmup then linear decay to 0, batch 32, 3 epochs, lr 5e-5 (the top of the paper's
# 2e-5 .. 5e-5 grid: the small imported encoders users start from, MiniLM-sized, need the higher
# end). Measured on SST-2 with an imported MiniLM beside transformers' fine-tune of it with the
# same recipe: docs/results.md, benchmarks/bench_finetune.py.
FROM_PRETRAINED = dict(lr=5e-5, beta2=0.999, weight_decay=0.01, schedule="linear", min_lr=0.0,
                       warmup_frac=0.1, epochs=3.0, batch_size=32)


def from_pretrained(base: Preset) -> Preset:
    """base with FROM_PRETRAINED's training settings (its model part gives only the head's
    pooling: a fine-tuned model keeps its source's shape)."""
    return Preset(base.model, dataclasses.replace(base.train, **FROM_PRETRAINED))


PRESETS: dict[str, Preset] = {
    # The usual CPU-sized Shakespeare run, and the default.
    "baby": Preset(ModelConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0),
                   TrainConfig(batch_size=12, lr=1e-3, max_iters=2000)),
    # The usual GPU-sized run.
    "shakespeare": Preset(ModelConfig(block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2),
                          TrainConfig(batch_size=64, lr=1e-3, max_iters=5000,
                                      eval_interval=500, eval_iters=100)),
    # BERT pretraining (masked-LM + next-sentence) on the shipped Shakespeare, in minutes on 2
    # cores: post-norm as in BERT, WordPiece, sentence pairs of consecutive lines.
    "bert-baby": Preset(ModelConfig(arch="bert", vocab_size=2000, block_size=64, n_layer=4,
                                    n_head=4, n_embd=128, dropout=0.1, norm="post",
                                    embed_norm=True, final_norm=False, pooling="mean"),
                        TrainConfig(tokenizer="wordpiece", batch_size=32, lr=1e-3,
                                    max_iters=2000, eval_iters=20)),
    # Fine-tuning a BERT to classify (--task classify): a lower rate, short warmup and decay,
    # light weight decay, an evaluation (on the whole validation set) every 50 steps. With
    # --init-from only the training settings apply; the model is the source's. The rate and
    # length: on the speaker demo (benchmarks/bench_bert.py) 2e-4 for 300 steps left both the
    # pretrained and the from-scratch model underfitted (train accuracy under 45%).
    "bert-classify": bert_fine_tuning("classify", "mean"),
    # Fine-tuning a BERT to tag named entities (--task tag): bert-classify's schedule, the
    # head reading each token; from scratch without next-sentence prediction, which a tagger
    # never uses.
    "bert-tag": bert_fine_tuning("tag", "token", nsp=False),
    # Fine-tuning a BERT to answer questions from a context (--task qa, SQuAD JSON): the same,
    # the head reading each token for the answer's start and end; a context of 128, as a
    # question and a paragraph need more room than a sentence.
    "bert-qa": bert_fine_tuning("qa", "span", nsp=False, block_size=128),
    # The Transformer paper's translator sized for 2 CPU cores (3 + 3 pre-norm blocks, joint BPE):
    # 11 epochs of Multi30k; wsd (val ppl 14.9 after 400 steps there, the paper's inverse_sqrt 17).
    "seq2seq": Preset(
        ModelConfig(arch="seq2seq", vocab_size=8000, block_size=128, n_layer=3, n_head=4,
                    n_embd=256, dropout=0.1, pos_encoding="sinusoidal"),
        TrainConfig(tokenizer="bpe", max_tokens=4096, label_smoothing=0.1, lr=1e-3, beta2=0.98,
                    warmup_iters=400, weight_decay=0.01, max_iters=2500, eval_iters=10)),
    # The minimal model of the classic from-scratch tutorial this project started from: embedding,
    # fixed sinusoidal positions, a layer norm, one multi-head attention layer (W_Q, W_K, W_V; no
    # W_O, MLP or residual) and an output projection with bias, trained by plain SGD.
    "seed": Preset(ModelConfig(block_size=10, n_layer=1, n_head=5, n_embd=60, dropout=0.0,
                               bias=False, pos_encoding="sinusoidal", mlp=False, attn_proj=False,
                               residual=False, block_norm=False, embed_norm=True,
                               final_norm=False, tie_weights=False, head_bias=True, embed_std=1.0),
                   TrainConfig(optimizer="sgd", lr=1e-3, warmup_iters=0, schedule="constant",
                               weight_decay=0.0, grad_clip=0.0)),
}
# The three BERT fine-tuning tasks from a pretrained encoder (FROM_PRETRAINED): the default with
# --init-from (pygpt.families.bert).
PRESETS.update({f"{name}-pretrained": from_pretrained(PRESETS[name])
                for name in ("bert-classify", "bert-tag", "bert-qa")})


def preset(name: str) -> Preset:
    """A fresh copy of the named preset."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], model=dataclasses.replace(PRESETS[name].model),
                               train=dataclasses.replace(PRESETS[name].train))
