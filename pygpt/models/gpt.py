"""The GPT: embeddings (token + learned or sinusoidal positions, or none: rotary positions act in
attention), a stack of causal transformer blocks, a final layer norm and the LM head, GPT-2
initialised. Attention, every layer norm and the loss run on the model's kernel set: ours
(`ext`, default) or plain PyTorch (`torch`), the reference path that must agree with ours.

Decoding contract (pygpt.decoding.sampling.Decoder): `prefill(idx)` runs a window and returns its logits
and a KVCache; `step(idx, cache)` runs the next positions against the cache and extends it.
With rotary or no positions the cache rolls (`rolling_cache`): it keeps the last block_size
positions, so decoding goes on past the context without re-prefilling.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn

from pygpt.config import ModelConfig
from pygpt.decoding.sampling import Generates
from pygpt.kernels import KernelModule
from pygpt.models.blocks import transformer_block
from pygpt.nn import Embeddings, KVCache, LayerNorm, gpt2_init, position_bias
from pygpt.positions import encoding


# From this vocabulary size on, forward with targets fuses the LM head into the loss
# (kern.linear_cross_entropy: no (B, T, vocab_size) logits, which then are not returned). Below,
# the logits are small next to the activations and the plain head + loss is as quick.
FUSED_LOSS_MIN_VOCAB = 8192


class GPTOutput(NamedTuple):
    logits: Optional[torch.Tensor]  # (B, T, vocab_size); None when the loss was fused
    loss: Optional[torch.Tensor]  # mean next-token cross-entropy, when targets are given


class GPT(KernelModule, Generates):
    def __init__(self, cfg: ModelConfig, kernels: str = "ext"):
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg.vocab_size, cfg.n_embd, cfg.block_size,
                                position=cfg.pos_encoding, dropout=cfg.dropout,
                                norm=cfg.embed_norm, norm_eps=cfg.norm_eps)
        self.blocks = nn.ModuleList(transformer_block(cfg, i, causal=True)
                                    for i in range(cfg.n_layer))
        # relative / alibi: one score bias for every layer (else None).
        self.pos_bias = position_bias(cfg.pos_encoding, cfg.n_head, cfg.max_distance)
        self.final_norm = LayerNorm(cfg.n_embd, cfg.norm_eps) if cfg.final_norm else None
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_weights:
            self.lm_head.weight = self.embed.tok.weight
        residual_projections = [layer.proj for block in self.blocks
                                for layer in (block.attn, block.mlp)
                                if layer is not None and layer.proj is not None]
        gpt2_init(self, cfg.n_layer, residual_projections, self.embed.tok, cfg.embed_std)
        self.kernels = kernels

    @property
    def context_length(self) -> int:
        return self.config.block_size

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def rolling_cache(self) -> bool:
        """Whether the cache keeps the last context_length positions, dropping the oldest, when
        decoding passes the context (valid only when attention depends on relative positions)."""
        return encoding(self.config.pos_encoding).relative

    def new_cache(self) -> KVCache:
        """An empty cache with room for one window (rolling: keeps the last window)."""
        return KVCache(len(self.blocks), window=self.context_length if self.rolling_cache else None,
                       capacity=self.context_length)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                cache: Optional[KVCache] = None,
                lengths: Optional[torch.Tensor] = None) -> GPTOutput:
        """idx (B, T) token ids at positions cache.next_positions .. + T - 1 (from 0 without a
        cache); lengths (B,): each row's real tokens of a right-padded idx (their logits alone
        are meaningful; with a cache, each row's are appended at the row's own end). Returns
        logits for every position and the loss against targets (B, T) if given (from
        FUSED_LOSS_MIN_VOCAB tokens on, the loss alone: logits None). A cache is extended by
        these T positions."""
        return self.head(self.features(idx, cache, lengths), targets)

    def features(self, idx: torch.Tensor, cache: Optional[KVCache] = None,
                 lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The LM head's input (B, T, n_embd) at each position of idx (forward's arguments)."""
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, time), got shape {tuple(idx.shape)}")
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"the cache has {len(cache)} layers, the model {len(self.blocks)}")
        x = self.embed(idx, start=cache.next_positions if cache is not None else 0)
        bias = self.pos_bias() if self.pos_bias is not None else None
        for i, block in enumerate(self.blocks):
            x = block(x, cache[i] if cache is not None else None, lengths, position_bias=bias)
        return self.final_norm(x) if self.final_norm is not None else x

    def head(self, x: torch.Tensor, targets: Optional[torch.Tensor] = None) -> GPTOutput:
        """forward's output from the features x (B, T, n_embd)."""
        B, T = x.shape[:2]
        if targets is not None and self.config.vocab_size >= FUSED_LOSS_MIN_VOCAB:
            loss = self.kern.linear_cross_entropy(x.reshape(B * T, -1), self.lm_head.weight,
                                                  targets.reshape(B * T), self.lm_head.bias)
            return GPTOutput(None, loss)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = self.kern.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        return GPTOutput(logits, loss)

    def prefill(self, idx: torch.Tensor,
                lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, KVCache]:
        """idx (B, T) from position 0 -> logits (B, T, V) and a new cache of these positions;
        lengths (B,): the real tokens of right-padded rows (batched generation)."""
        cache = self.new_cache()
        return self(idx, cache=cache, lengths=lengths).logits, cache

    def step(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        return self(idx, cache=cache).logits
