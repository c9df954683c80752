"""The encoder-decoder Transformer of "Attention Is All You Need", for translation.

- One token embedding for source and target (a joint vocabulary), multiplied by sqrt(n_embd) as
  in the paper and initialised N(0, n_embd^-1/2) (so its input is unit-scale), plus the
  config's position encoding (sinusoidal in the seq2seq presets), separately for each side.
- The encoder: n_layer non-causal blocks over the right-padded source (src_lengths), then a
  final layer norm when the config has one (pre-norm; post-norm models end in one already).
- The decoder: n_dec_layer (0: n_layer) blocks of causal self-attention, cross-attention over
  the encoder's output (never its padding) and the MLP; a final norm likewise; then the output
  projection, tied to the token embedding unless tie_weights is off.
- Heads may have query/key width qk_dim and value width v_dim (default n_embd / n_head).
- The loss is the mean label-smoothed cross-entropy of the target's real positions (padded
  targets are IGNORE_INDEX); the smoothing is a training setting (TrainConfig.label_smoothing),
  which the translation task passes to forward (pygpt.tasks.seq2seq), 0 by default. Linear layers are Xavier-uniform
  initialised (biases zero), as in the paper's reference code, tensor2tensor.

Incremental decoding (pygpt.decoding.beam_search): `encode` once per batch, then `decode` one
position at a time against a DecoderCache (`new_decoder_cache`), which also holds each layer's
cross-attention keys and values of the memory, computed on the first step only.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn

from pygpt.config import ModelConfig
from pygpt.kernels import KernelModule
from pygpt.data.common import IGNORE_INDEX  # the target label the loss skips (padding)
from pygpt.models.blocks import decoder_block, transformer_block
from pygpt.nn import Embeddings, LayerNorm, position_bias
from pygpt.nn.decoder_block import DecoderCache
from pygpt.nn.fused_linear import weight_blocks


class Seq2SeqOutput(NamedTuple):
    logits: torch.Tensor  # (B, T, vocab_size): the next-token logits at each target position
    loss: Optional[torch.Tensor]  # mean over tgt_out's real tokens, when tgt_out is given


class ScaledEmbedding(nn.Embedding):
    """A token embedding read out times sqrt(dim); a tied output layer sees the unscaled table."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx) * math.sqrt(self.embedding_dim)


def _check_tokens(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2 or t.shape[1] < 1:
        raise ValueError(f"{name} must be (batch, time) with at least one position, got shape "
                         f"{tuple(t.shape)}")


class Seq2Seq(KernelModule):
    def __init__(self, cfg: ModelConfig, kernels: str = "ext"):
        super().__init__()
        self.config = cfg
        d = cfg.n_embd
        self.src_embed, self.tgt_embed = (
            Embeddings(cfg.vocab_size, d, cfg.block_size, position=cfg.pos_encoding,
                       dropout=cfg.dropout, norm=cfg.embed_norm, norm_eps=cfg.norm_eps)
            for _ in range(2))
        self.src_embed.tok = self.tgt_embed.tok = ScaledEmbedding(cfg.vocab_size, d)
        self.encoder = nn.ModuleList(transformer_block(cfg, i, causal=False)
                                     for i in range(cfg.n_layer))
        self.decoder = nn.ModuleList(decoder_block(cfg) for _ in range(cfg.decoder_layers))
        # Relative or ALiBi positions: one score bias for the encoder's self-attention, one for
        # the decoder's (cross-attention has none: source and target positions do not align).
        self.enc_bias, self.dec_bias = (position_bias(cfg.pos_encoding, cfg.n_head,
                                                      cfg.max_distance) for _ in range(2))
        self.encoder_norm = LayerNorm(d, cfg.norm_eps) if cfg.final_norm else None
        self.decoder_norm = LayerNorm(d, cfg.norm_eps) if cfg.final_norm else None
        self.out = nn.Linear(d, cfg.vocab_size, bias=cfg.head_bias)
        self._init_weights()
        if cfg.tie_weights:
            self.out.weight = self.src_embed.tok.weight
        self.kernels = kernels

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                for weight in weight_blocks(module):  # each fused map on its own fans
                    nn.init.xavier_uniform_(weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.src_embed.tok.weight, 0.0, self.config.n_embd ** -0.5)

    @property
    def max_target_length(self) -> int:
        """The most target positions the decoder takes ([BOS] included)."""
        return self.config.block_size

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_decoder_cache(self) -> DecoderCache:
        return DecoderCache(len(self.decoder))

    def encode(self, src: torch.Tensor, src_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The encoder's output (B, S, n_embd) for source ids src (B, S) whose rows hold
        src_lengths (B,) real tokens (None: all S); its padded rows are not meaningful."""
        _check_tokens("src", src)
        x = self.src_embed(src)
        bias = self.enc_bias() if self.enc_bias is not None else None
        for block in self.encoder:
            x = block(x, lengths=src_lengths, position_bias=bias)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               memory_lengths: Optional[torch.Tensor] = None,
               cache: Optional[DecoderCache] = None,
               tgt_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Next-token logits: the output projection of decode_features (same arguments)."""
        return self.out(self.decode_features(tgt_in, memory, memory_lengths, cache, tgt_lengths))

    def decode_features(self, tgt_in: torch.Tensor, memory: torch.Tensor,
                        memory_lengths: Optional[torch.Tensor] = None,
                        cache: Optional[DecoderCache] = None,
                        tgt_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The output projection's input (B, T, n_embd) (decode's logits: (B, T, vocab_size))
        for target ids tgt_in (B, T) at positions cache.length .. cache.length + T - 1 (from 0
        without a cache), given the encoder's output memory (B, S, n_embd) with memory_lengths
        (B,) real positions. tgt_lengths (B,): the real
        positions of a right-padded tgt_in (not with a cache). A cache is extended by these T
        positions; its cross-attention part is filled from memory on the first call."""
        _check_tokens("tgt_in", tgt_in)
        if cache is not None and len(cache) != len(self.decoder):
            raise ValueError(f"the cache has {len(cache)} layers, the decoder "
                             f"{len(self.decoder)}")
        if cache is not None and tgt_lengths is not None:
            raise ValueError("tgt_lengths cannot be used with a cache, whose rows are unpadded")
        x = self.tgt_embed(tgt_in, start=cache.length if cache is not None else 0)
        bias = self.dec_bias() if self.dec_bias is not None else None
        for i, block in enumerate(self.decoder):
            x = block(x, memory, memory_lengths, cache.layer(i) if cache is not None else None,
                      lengths=tgt_lengths, position_bias=bias)
        return self.decoder_norm(x) if self.decoder_norm is not None else x

    def forward(self, src: torch.Tensor, src_lengths: Optional[torch.Tensor],
                tgt_in: torch.Tensor, tgt_out: Optional[torch.Tensor] = None,
                tgt_lengths: Optional[torch.Tensor] = None,
                label_smoothing: float = 0.0) -> Seq2SeqOutput:
        """Teacher forcing over a batch (the fields of pygpt.data.parallel.TranslationBatch):
        logits for every target position and, with tgt_out (B, T) (the next tokens, IGNORE_INDEX
        on padding), the loss, label-smoothed by label_smoothing."""
        return self.head(self.decode_features(tgt_in, self.encode(src, src_lengths), src_lengths,
                                              tgt_lengths=tgt_lengths), tgt_out, label_smoothing)

    def head(self, x: torch.Tensor, tgt_out: Optional[torch.Tensor] = None,
             label_smoothing: float = 0.0) -> Seq2SeqOutput:
        """forward's output from the decoder's features x (decode_features')."""
        logits = self.out(x)
        loss = None
        if tgt_out is not None:
            if tgt_out.shape != x.shape[:2]:
                raise ValueError(f"tgt_out must have tgt_in's shape {tuple(x.shape[:2])}, got "
                                 f"{tuple(tgt_out.shape)}")
            loss = self.kern.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           tgt_out.reshape(-1), ignore_index=IGNORE_INDEX,
                                           label_smoothing=label_smoothing)
        return Seq2SeqOutput(logits, loss)
