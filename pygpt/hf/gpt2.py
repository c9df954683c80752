"""GPT-2 (`transformers`' GPT2LMHeadModel and GPT2Model) as pygpt's GPT, both ways.

pygpt's GPT with learned positions, pre-norm blocks, biases, a final layer norm and a head tied
to the token embedding (or not) is GPT-2's architecture; what differs is the storage:
- GPT-2's linear layers are Conv1D, weights stored as (in, out): transposed here;
- its attention input projection `c_attn` stacks queries, keys and values as our `qkv` does;
- `gelu_new` (GELU's tanh approximation) is our activation "gelu_tanh", its
  `layer_norm_epsilon` our norm_eps;
- its attention dropout (on the probabilities) has no counterpart here: training only, it never
  changes logits; pygpt's one `dropout` is GPT-2's resid_pdrop and embd_pdrop.
Options GPT-2 has and pygpt lacks (scale_attn_by_inverse_layer_idx, an MLP width other than 4x,
cross-attention), and pygpt's options GPT-2 lacks (rotary, ALiBi or relative positions,
post-norm, the `seed` preset's switches...), are refused naming the option."""
from __future__ import annotations

from typing import Any, Optional

from pygpt.config import ModelConfig
from pygpt.hf.mapping import (Layout, TensorMap, check_architectures, head_width_reasons,
                              layer_size_reasons, linear, refuse, setting)

MODEL_TYPE = "gpt2"
ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
PREFIX = "transformer."  # GPT2LMHeadModel's name for the GPT2Model inside it
# GPT-2's activation_function names -> pygpt's activation.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# Settings that must keep GPT-2's value for pygpt's GPT to compute the same thing, and it.
FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
         "add_cross_attention": False}


def tensor_maps(cfg: ModelConfig, prefix: str) -> list[TensorMap]:
    p = prefix
    maps = [TensorMap("embed.tok.weight", (f"{p}wte.weight",)),
            TensorMap("embed.pos.weight", (f"{p}wpe.weight",))]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}.", f"{p}h.{i}."
        maps += (linear(ours + "attn_norm", theirs + "ln_1")
                 + linear(ours + "attn.qkv", theirs + "attn.c_attn", transposed=True)
                 + linear(ours + "attn.proj", theirs + "attn.c_proj", transposed=True)
                 + linear(ours + "mlp_norm", theirs + "ln_2")
                 + linear(ours + "mlp.fc", theirs + "mlp.c_fc", transposed=True)
                 + linear(ours + "mlp.proj", theirs + "mlp.c_proj", transposed=True))
    maps += linear("final_norm", f"{p}ln_f")
    if not cfg.tie_weights:
        maps.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return maps


def import_layout(hf: dict[str, Any], names: set[str]) -> Layout:
    """The pygpt GPT of a GPT-2 config.json whose weights file holds the tensors `names`."""
    check_architectures(hf, ARCHITECTURES)
    n_embd = setting(hf, "n_embd", 768, int)
    reasons = [f"{name} is {hf[name]!r} (pygpt's GPT has only {value!r})"
               for name, value in FIXED.items() if hf.get(name, value) != value]
    activation = setting(hf, "activation_function", "gelu_new", str)
    if activation not in ACTIVATIONS:
        reasons.append(f"activation_function {activation!r} (pygpt has "
                       f"{', '.join(ACTIVATIONS)})")
    n_inner = setting(hf, "n_inner", None, int)
    if n_inner is not None and n_inner < 1:
        reasons.append(f"n_inner is {n_inner} (an MLP needs a positive width)")
    refuse("this GPT-2", reasons)
    tie = setting(hf, "tie_word_embeddings", True, bool)
    try:
        cfg = ModelConfig(
            arch="gpt", vocab_size=setting(hf, "vocab_size", 50257, int),
            block_size=setting(hf, "n_positions", 1024, int),
            n_layer=setting(hf, "n_layer", 12, int), n_head=setting(hf, "n_head", 12, int),
            n_embd=n_embd, mlp_dim=0 if n_inner in (None, 4 * n_embd) else n_inner,
            dropout=setting(hf, "resid_pdrop", 0.1, float),
            activation=ACTIVATIONS[activation],
            norm_eps=setting(hf, "layer_norm_epsilon", 1e-5, float), tie_weights=tie)
    except ValueError as e:
        raise ValueError(f"config.json: {e}") from None
    prefix = PREFIX if any(n.startswith(PREFIX) for n in names) else ""
    # The causal masks older versions saved as buffers; lm_head.weight when tied (a copy).
    ignored = {f"{prefix}h.{i}.attn.{b}" for i in range(cfg.n_layer) for b in ("bias", "masked_bias")}
    if tie:
        ignored.add("lm_head.weight")
    return Layout(cfg, tensor_maps(cfg, prefix), ignored)


def export_config(cfg: ModelConfig, special_tokens: dict[str, int],
                  labels: Optional[list[str]]) -> tuple[dict[str, Any], list[TensorMap]]:
    """GPT2LMHeadModel's config.json for the GPT cfg, and its tensor maps; a ValueError naming
    each option GPT-2 cannot represent."""
    switches = {"bias": "GPT-2's projections have biases", "final_norm": "GPT-2 has one",
                "attn_proj": "the seed preset's switch", "residual": "the seed preset's switch",
                "block_norm": "the seed preset's switch", "mlp": "GPT-2's blocks have one"}
    reasons = [f"{name} is off ({why})" for name, why in switches.items()
               if not getattr(cfg, name)]
    if cfg.pos_encoding != "learned":
        reasons.append(f"pos_encoding is {cfg.pos_encoding!r} (GPT-2 learns absolute positions)")
    if cfg.norm != "pre":
        reasons.append(f"norm is {cfg.norm!r} (GPT-2 is pre-norm)")
    reasons += head_width_reasons(cfg) + layer_size_reasons(cfg)
    if cfg.embed_norm:
        reasons.append("embed_norm is on (GPT-2 has no norm after the embeddings)")
    if cfg.head_bias:
        reasons.append("head_bias is on (GPT-2's LM head has no bias)")
    refuse("this GPT to GPT-2", reasons)
    eos = special_tokens.get("<|endoftext|>")
    hf = {"architectures": ["GPT2LMHeadModel"], "model_type": MODEL_TYPE,
          "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_embd": cfg.n_embd,
          "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.mlp_dim or None,
          "activation_function": TO_HF_ACTIVATION[cfg.activation],
          "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": 0.0,
          "layer_norm_epsilon": cfg.norm_eps, "initializer_range": 0.02,
          **FIXED, "reorder_and_upcast_attn": False, "tie_word_embeddings": cfg.tie_weights,
          "bos_token_id": eos, "eos_token_id": eos, "dtype": "float32"}
    return hf, tensor_maps(cfg, PREFIX)
