"""A model's shape, as the dataclass ModelConfig: what a checkpoint's weights mean, saved in
config.json beside them (every field is a flag of `python -m pygpt.train`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pygpt.config.fields import applies, check_field_types, families_of, opt, tagged
from pygpt.positions import ENCODINGS, encoding

# The model families (pygpt.families), by the name a config's `arch` gives.
ARCHS = ("gpt", "bert", "seq2seq")
# The largest value of each size of a ModelConfig, and the most numbers (weights and fixed
# position tables) a model may hold: far beyond any model this CPU-first package trains, but a
# refusal in one line before a typo or a hand-edited config.json asks for gigabytes.
MAX_SIZES = {"vocab_size": 1 << 20, "block_size": 1 << 20, "n_layer": 1 << 10,
             "n_dec_layer": 1 << 10, "n_head": 1 << 10, "n_embd": 1 << 16, "qk_dim": 1 << 16,
             "v_dim": 1 << 16, "mlp_dim": 1 << 20, "rotary_dim": 1 << 16, "max_distance": 1 << 20,
             "type_vocab_size": 1 << 10, "num_labels": 1 << 20}
MAX_NUMBERS = 1 << 30


@dataclass
class ModelConfig:
    """What a checkpoint's weights mean; saved in config.json beside them."""

    arch: Literal[ARCHS] = opt("gpt", "model family: gpt (decoder-only, next-token), bert "
                                      "(encoder-only, masked-LM; its default preset is bert-baby) "
                                      "or seq2seq (encoder-decoder translator)")
    vocab_size: int = opt(65, "tokens in the vocabulary: with --tokenizer bpe or wordpiece the "
                              "size to train (default 1024); a char tokenizer sets it from the "
                              "text")
    block_size: int = opt(64, "context length in tokens")
    n_layer: int = opt(4, "transformer blocks")
    n_head: int = opt(4, "attention heads per block")
    n_embd: int = opt(128, "embedding width")
    dropout: float = opt(0.0, "dropout on embeddings and residual branches while training")
    bias: bool = opt(True, "biases in the attention and MLP projections")
    pos_encoding: Literal[tuple(ENCODINGS)] = opt(
        "learned", "position encoding: learned or sinusoidal vectors added to the tokens, rotary "
                   "(RoPE: each attention layer rotates queries and keys by position), a bias of "
                   "the attention scores (relative: learned per head and clipped distance; "
                   "alibi: fixed per-head slopes times the distance), or none")
    rotary_dim: int = opt(0, "rotary: channels of each head that rotate (even; 0: all)")
    rope_base: float = opt(10000.0, "rotary: the base of the rotation frequencies")
    max_distance: int = opt(32, "relative: distances beyond this share one learned bias")
    mlp: bool = opt(True, "the block's MLP")
    activation: Literal["gelu", "gelu_tanh", "relu"] = opt(
        "gelu", "the MLP's nonlinearity: the exact (erf) GELU, GELU's tanh approximation "
                "(GPT-2's gelu_new) or ReLU")
    norm_eps: float = opt(1e-5, "the epsilon of every layer norm of the model (GPT-2's 1e-5, "
                                "BERT's 1e-12)")
    # Switches that only the `seed` preset turns off, to rebuild the tutorial model exactly.
    attn_proj: bool = opt(True, "W_O after the concatenated heads")
    residual: bool = opt(True, "residual connections around attention and MLP")
    block_norm: bool = opt(True, "layer norms inside each block")
    norm: Literal["pre", "post"] = opt("pre", "where a block's layer norms sit: before each "
                                              "sub-layer (pre, GPT-2's) or after its residual add "
                                              "(post, BERT's and the original Transformer's)")
    embed_norm: bool = opt(False, "a layer norm right after token embedding + position")
    final_norm: bool = opt(True, "the layer norm before the LM head")
    tie_weights: bool = opt(True, "LM head shares the token embedding's weights")
    head_bias: bool = opt(False, "a bias on the LM head")
    embed_std: float = opt(0.02, "std of the token embedding's normal initialisation")
    # BERT only.
    type_vocab_size: int = opt(2, "bert: segment (sentence A / B) embeddings", "bert")
    nsp: bool = opt(True, "bert: the next-sentence-prediction head and loss (--no-nsp: "
                          "masked-LM only, as RoBERTa)", "bert")
    num_labels: int = opt(0, "bert: classes of the classification head (0: none; fine-tuning "
                             "sets it from the labels)", "bert")
    pooling: Literal["cls", "mean", "token", "span"] = opt(
        "cls", "bert: what the classification head reads: the pooler's [CLS] vector (pretrained "
               "only by next-sentence prediction), the mean of the final hidden states over "
               "the real tokens (pretrained by the masked-LM; the bert presets' choice, as it "
               "transfers better; cls is what checkpoints saved without this field used), "
               "each token's own final hidden state, one label per token (--task tag's entity "
               "tagger), or each token's for two logits, the answer's start and end there "
               "(span: --task qa's extractive question answering)", "bert")
    # seq2seq only.
    n_dec_layer: int = opt(0, "seq2seq: decoder blocks (0: as many as --n-layer, the "
                              "encoder's)", "seq2seq")
    # Widths apart from n_embd (a pruned model's): a config holds them only where set.
    qk_dim: int = opt(0, "width of one head's queries and keys (0: n_embd / n_head)",
                      listed=("seq2seq",))
    v_dim: int = opt(0, "width of one head's values (0: n_embd / n_head)", listed=("seq2seq",))
    mlp_dim: int = opt(0, "the MLP's hidden width (0: 4 * n_embd)", listed=())
    # Sizes that differ between layers (a globally pruned model's): empty, every layer has
    # n_head heads and mlp_width MLP units. gpt and bert only: a translator's decoder layers
    # hold two attentions each, which one size per layer cannot say.
    layer_heads: tuple[int, ...] = opt((), "gpt, bert: each layer's attention heads, comma-"
                                           "separated, each 1 to n_head (empty: n_head in every "
                                           "layer)", ("gpt", "bert"), listed=())
    layer_mlp_dims: tuple[int, ...] = opt((), "gpt, bert: each layer's MLP hidden width, comma-"
                                              "separated (empty: mlp_width in every layer)",
                                          ("gpt", "bert"), listed=())

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head and not (self.qk_dim and self.v_dim):
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
                             " unless qk_dim and v_dim set the heads' widths")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if encoding(self.pos_encoding).rotary and (not 0 <= self.rotary_dim <= self.qk_head_dim
                                              or self.rotary_width % 2):
            raise ValueError(f"rotary_dim must be even and at most the query/key head width "
                             f"{self.qk_head_dim} (0: all of it), got {self.rotary_width}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ValueError(f"norm_eps must be a finite number > 0, got {self.norm_eps}")
        if not self.rope_base > 1.0:
            raise ValueError(f"rope_base must be greater than 1, got {self.rope_base}")
        for name in ("type_vocab_size", "num_labels", "n_dec_layer", "qk_dim", "v_dim",
                     "mlp_dim", "max_distance"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.pooling == "span" and self.num_labels not in (0, 2):
            raise ValueError("pooling span's head gives each token two logits (the answer's "
                             f"start and end there): num_labels must be 2, got {self.num_labels}")
        for name, most in MAX_SIZES.items():
            if getattr(self, name) > most:
                raise ValueError(f"{name} must be at most {most:,}, got {getattr(self, name):,}")
        foreign: dict[tuple[str, ...], list[str]] = {}  # families -> their fields set here
        for f in tagged(ModelConfig, "family"):
            if self.arch not in families_of(f) and getattr(self, f.name) != f.default:
                foreign.setdefault(families_of(f), []).append(f.name)
        for families, names in foreign.items():
            verb = "applies" if len(names) == 1 else "apply"
            raise ValueError(f"{', '.join(names)} {verb} to arch {' and '.join(families)} only, "
                             f"not {self.arch}")
        self._check_layer_sizes()
        if self.numbers > MAX_NUMBERS:
            raise ValueError(f"the model would hold about {self.numbers:,} numbers (weights and "
                             f"position tables), more than the {MAX_NUMBERS:,} pygpt builds: "
                             "make n_embd, n_layer, vocab_size or block_size smaller")

    def _check_layer_sizes(self) -> None:
        """layer_heads and layer_mlp_dims: one size per layer, each in range, on a model that
        can hold them (a ValueError in one line otherwise)."""
        for name, most in (("layer_heads", self.n_head), ("layer_mlp_dims", MAX_SIZES["mlp_dim"])):
            sizes = getattr(self, name)
            if not sizes:
                continue
            if len(sizes) != self.n_layer:
                raise ValueError(f"{name} must hold one size per layer (n_layer {self.n_layer}),"
                                 f" got {len(sizes)}")
            if not all(1 <= n <= most for n in sizes):
                raise ValueError(f"{name} must hold sizes of 1 to {most:,}, got {list(sizes)}")
        if self.layer_heads and not self.attn_proj:
            raise ValueError("layer_heads needs attn_proj: without W_O every layer's heads must "
                             "be as wide as n_embd")
        if self.layer_heads and encoding(self.pos_encoding).score_bias is not None:
            raise ValueError(f"layer_heads cannot be used with pos_encoding {self.pos_encoding}:"
                             " its per-head score bias is shared by every layer's heads")
        if self.layer_mlp_dims and not self.mlp:
            raise ValueError("layer_mlp_dims needs an MLP (mlp is off)")

    def heads(self, layer: int) -> int:
        """The attention heads of layer `layer` (layer_heads', else n_head)."""
        return self.layer_heads[layer] if self.layer_heads else self.n_head

    def mlp_width_of(self, layer: int) -> int:
        """The MLP hidden width of layer `layer` (layer_mlp_dims', else mlp_width)."""
        return self.layer_mlp_dims[layer] if self.layer_mlp_dims else self.mlp_width

    @property
    def numbers(self) -> int:
        """About how many numbers building the model allocates: its weights and the position
        tables that follow from block_size (what MAX_NUMBERS bounds)."""
        d, rotary = self.n_embd, encoding(self.pos_encoding).rotary

        def attention(heads: int) -> int:  # queries, keys, values, output projection
            qk, v = heads * self.qk_head_dim, heads * self.v_head_dim
            return d * (2 * qk + v) + v * d

        mlp = (lambda width: 2 * d * width) if self.mlp else (lambda width: 0)
        layers = [attention(self.heads(i)) + mlp(self.mlp_width_of(i)) for i in range(self.n_layer)]
        # Decoder blocks, with cross-attention (a family whose config has n_dec_layer).
        decoder = self.decoder_layers if applies(ModelConfig, "n_dec_layer", self.arch) else 0
        rotated = self.n_layer + decoder if rotary else 0
        return (2 * self.vocab_size * d + self.block_size * (d + rotated * self.rotary_width)
                + sum(layers) + decoder * (2 * attention(self.n_head) + mlp(self.mlp_width)))

    @property
    def head_dim(self) -> int:
        """The width of one attention head."""
        return self.n_embd // self.n_head

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width (mlp_dim, else 4 * n_embd)."""
        return self.mlp_dim or 4 * self.n_embd

    @property
    def rotary_width(self) -> int:
        """The channels of a head's queries and keys that rotary rotates."""
        return self.rotary_dim or self.qk_head_dim

    @property
    def qk_head_dim(self) -> int:
        """The width of one head's queries and keys (qk_dim, else head_dim)."""
        return self.qk_dim or self.head_dim

    @property
    def v_head_dim(self) -> int:
        """The width of one head's values (v_dim, else head_dim)."""
        return self.v_dim or self.head_dim

    @property
    def decoder_layers(self) -> int:
        """seq2seq: the decoder's blocks (n_dec_layer, else n_layer)."""
        return self.n_dec_layer or self.n_layer
