"""The building blocks every pygpt model is assembled from. Modules that call kernels (layer
norm, attention) run on ours by default; set `.kernels = "torch"` on a model or any module to
switch it and everything inside to the plain-PyTorch reference."""
from pygpt.nn.attention import MultiHeadAttention
from pygpt.nn.block import Block
from pygpt.nn.embedding import Embeddings
from pygpt.nn.init import gpt2_init
from pygpt.nn.kv_cache import KVCache, LayerKV
from pygpt.nn.layer_norm import LayerNorm
from pygpt.nn.mlp import MLP
from pygpt.nn.position import LearnedPositions, SinusoidalPositions, position_encoding
from pygpt.nn.position_bias import PositionBias, ScoreBias, alibi_slopes, position_bias
from pygpt.nn.rotary import Rotary

__all__ = ["Block", "Embeddings", "KVCache", "LayerKV", "LayerNorm", "LearnedPositions", "MLP",
           "MultiHeadAttention", "PositionBias", "Rotary", "ScoreBias", "SinusoidalPositions",
           "alibi_slopes", "gpt2_init", "position_bias", "position_encoding"]
