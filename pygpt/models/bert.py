"""BERT: an encoder over a right-padded batch of sentence pairs, [CLS] A [SEP] B [SEP], that sees
the whole sequence at once (bidirectional attention, never attending to padding), pretrained by
masked language modelling and next-sentence prediction, then fine-tuned to classify.

Embeddings are token + position + segment (A or B), then a layer norm and dropout; the blocks
are post-norm ("Add & Norm", as in BERT) or pre-norm (then with a final norm), per the config.
Heads: the pooler (tanh of a linear map of the [CLS] vector), the masked-LM head (a transform,
GELU, layer norm, then a decoder tied to the token embedding, with its own bias), the
next-sentence head on the pooled vector, and a classification head when `num_labels` > 0,
reading the pooled [CLS] vector, (pooling "mean") the mean hidden state of the real tokens, or
(pooling "token") each token's hidden state, for a label per token (entity tagging; as
Hugging Face's BertForTokenClassification: dropout, then one linear map, named `classifier`),
or (pooling "span", num_labels 2) each token's hidden state for two logits, the answer's start
and end there (extractive question answering; Hugging Face's BertForQuestionAnswering's
`qa_outputs`, which has no dropout before it: the same map at inference).
Initialisation as BERT's: every weight ~ N(0, 0.02), biases zero, layer norms at identity.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pygpt.config import ModelConfig
from pygpt.kernels import KernelModule
from pygpt.data.common import IGNORE_INDEX  # a label the losses skip
from pygpt.models.blocks import transformer_block
from pygpt.nn import Embeddings, LayerNorm, position_bias


class BertOutput(NamedTuple):
    loss: Optional[torch.Tensor]  # the sum of the losses whose labels were given
    mlm_logits: Optional[torch.Tensor]  # (n masked, V) with mlm_labels, else (B, T, V)
    nsp_logits: Optional[torch.Tensor]  # (B, 2): is B the true next segment?
    logits: Optional[torch.Tensor]  # (B, num_labels), or (B, T, num_labels) with pooling token
    # or span (there [..., 0] the answer's start logits, [..., 1] its end's)


def mean_over_tokens(h: torch.Tensor, lengths: Optional[torch.Tensor]) -> torch.Tensor:
    """The mean (B, C) of h (B, T, C) over each row's first lengths[b] positions (None: all)."""
    if lengths is None:
        return h.mean(1)
    real = torch.arange(h.shape[1], device=h.device) < lengths[:, None]
    return (h * real[..., None].to(h.dtype)).sum(1) / lengths[:, None].to(h.dtype)


class MaskedLMHead(KernelModule):
    """approximate: its GELU's, as F.gelu's ("none": erf, "tanh")."""

    def __init__(self, dim: int, vocab_size: int, *, approximate: str = "none",
                 norm_eps: float = 1e-5):
        super().__init__()
        self.transform = nn.Linear(dim, dim)
        self.approximate = approximate
        self.norm = LayerNorm(dim, norm_eps)
        self.decoder = nn.Linear(dim, vocab_size)  # its weight is tied to the token embedding

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.features(h))

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """The decoder's input: the transformed hidden states h."""
        return self.norm(F.gelu(self.transform(h), approximate=self.approximate))


class BERT(KernelModule):
    def __init__(self, cfg: ModelConfig, kernels: str = "ext"):
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg.vocab_size, cfg.n_embd, cfg.block_size,
                                position=cfg.pos_encoding, dropout=cfg.dropout,
                                norm=cfg.embed_norm, segments=cfg.type_vocab_size,
                                norm_eps=cfg.norm_eps)
        # relative / alibi: one score bias for every layer (else None).
        self.pos_bias = position_bias(cfg.pos_encoding, cfg.n_head, cfg.max_distance)
        self.blocks = nn.ModuleList(transformer_block(cfg, i, causal=False)
                                    for i in range(cfg.n_layer))
        self.final_norm = LayerNorm(cfg.n_embd, cfg.norm_eps) if cfg.final_norm else None
        self.pooler = nn.Linear(cfg.n_embd, cfg.n_embd)
        # The head's GELU is the blocks' tanh one with gelu_tanh, else the exact one (also under
        # relu, as models saved before the tanh GELU existed expect).
        self.mlm = MaskedLMHead(cfg.n_embd, cfg.vocab_size, norm_eps=cfg.norm_eps,
                                approximate="tanh" if cfg.activation == "gelu_tanh" else "none")
        if cfg.tie_weights:
            self.mlm.decoder.weight = self.embed.tok.weight
        self.nsp = nn.Linear(cfg.n_embd, 2) if cfg.nsp else None
        self.classifier = (nn.Sequential(nn.Dropout(cfg.dropout),
                                         nn.Linear(cfg.n_embd, cfg.num_labels))
                           if cfg.num_labels else None)
        self._init_weights()
        self.kernels = kernels

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encode(self, input_ids: torch.Tensor, segment_ids: Optional[torch.Tensor] = None,
               lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The final hidden states (B, T, n_embd) of input_ids (B, T); lengths (B,) are the real
        tokens of each row (None: all), segment_ids (B, T) 0 for A and 1 for B (None: all 0)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, time), got shape {tuple(input_ids.shape)}")
        x = self.embed(input_ids, segment_ids=segment_ids)
        bias = self.pos_bias() if self.pos_bias is not None else None
        for block in self.blocks:
            x = block(x, lengths=lengths, position_bias=bias)
        return self.final_norm(x) if self.final_norm is not None else x

    def forward(self, input_ids: torch.Tensor, segment_ids: Optional[torch.Tensor] = None,
                lengths: Optional[torch.Tensor] = None, mlm_labels: Optional[torch.Tensor] = None,
                nsp_labels: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None) -> BertOutput:
        """The heads' logits and, for the labels given, the sum of their mean cross-entropies:
        mlm_labels (B, T) (IGNORE_INDEX where nothing is to be predicted; the vocabulary is
        projected at those positions only), nsp_labels (B,) (1: B follows A), labels (B,), or
        with pooling "token" (B, T) (IGNORE_INDEX where no label is due: a word's later pieces,
        specials, padding; the loss is the mean over the others), or with pooling "span" (B, 2)
        the answer's start and end positions (0, [CLS]: no answer in the row; the loss is the
        mean of the start's and the end's cross-entropies over each row's real tokens)."""
        return self.heads(self.encode(input_ids, segment_ids, lengths), lengths, mlm_labels,
                          nsp_labels, labels)

    def heads(self, h: torch.Tensor, lengths: Optional[torch.Tensor] = None,
              mlm_labels: Optional[torch.Tensor] = None,
              nsp_labels: Optional[torch.Tensor] = None,
              labels: Optional[torch.Tensor] = None) -> BertOutput:
        """forward's output from the final hidden states h (encode's)."""
        ce = self.kern.cross_entropy
        losses = []
        if mlm_labels is not None:
            at = mlm_labels != IGNORE_INDEX
            mlm_logits = self.mlm(h[at])
            if mlm_logits.shape[0]:
                losses.append(ce(mlm_logits, mlm_labels[at]))
        else:
            mlm_logits = self.mlm(h) if self.classifier is None else None
        pooled = torch.tanh(self.pooler(h[:, 0]))
        nsp_logits = self.nsp(pooled) if self.nsp is not None else None
        if nsp_labels is not None and nsp_logits is not None:
            losses.append(ce(nsp_logits, nsp_labels))
        logits = None
        if self.classifier is not None:
            pooling = self.config.pooling
            logits = self.classifier(h if pooling in ("token", "span") else pooled
                                     if pooling == "cls" else mean_over_tokens(h, lengths))
        if labels is not None:
            if logits is None:
                raise ValueError("labels given to a BERT without a classification head "
                                 "(num_labels is 0)")
            if self.config.pooling == "span":
                losses.append(self.span_loss(logits, labels, lengths))
            elif self.config.pooling == "token":
                at = labels != IGNORE_INDEX
                if at.any():  # a batch may hold no labelled token (then no loss, as for mlm)
                    losses.append(ce(logits[at], labels[at]))
            else:
                losses.append(ce(logits, labels))
        loss = torch.stack(losses).sum() if losses else None
        return BertOutput(loss, mlm_logits, nsp_logits, logits)

    def span_loss(self, logits: torch.Tensor, labels: torch.Tensor,
                  lengths: Optional[torch.Tensor]) -> torch.Tensor:
        """The mean of the start's and the end's cross-entropy, each over the positions of the
        row's real tokens (padding can never be the answer, however a batch is padded), of
        span logits (B, T, 2) and labels (B, 2)."""
        if lengths is not None:
            real = torch.arange(logits.shape[1], device=logits.device) < lengths[:, None]
            logits = logits.masked_fill(~real[..., None], torch.finfo(logits.dtype).min)
        ce = self.kern.cross_entropy
        return (ce(logits[..., 0], labels[:, 0]) + ce(logits[..., 1], labels[:, 1])) / 2
