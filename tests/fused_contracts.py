"""The op-boundary contracts of the fused ops (bias_gelu, add_layer_norm), checked with all the
others by tests/test_op_contract.py."""

import torch

from contracts import Bad, Contract
from helpers import WHAT_DTYPE, WHAT_RANK, WHAT_SIZE, rand


# --- bias_gelu: x (..., C), bias (C,) -------------------------------------------------------


def _bias_gelu_good():
    return rand(4, 6), rand(6)


def _bias_gelu_bad():
    x, b = _bias_gelu_good()
    return {
        "x_float16": Bad((x.half(), b.half()), "x", WHAT_DTYPE, raw_only=True),
        "x_int": Bad((x.long(), b.long()), "x", WHAT_DTYPE),
        "bias_float64": Bad((x, b.double()), "bias", WHAT_DTYPE),
        "bias_len": Bad((x, rand(7)), "bias", WHAT_SIZE),
        "bias_2d": Bad((x, b.unsqueeze(0)), "bias", WHAT_RANK),
        "x_0d": Bad((torch.tensor(1.0), rand(1)), "x", WHAT_RANK),
    }


BIAS_GELU = Contract("bias_gelu", ("x", "bias"), options=("none",),  # approximate
                     good=_bias_gelu_good, bad=_bias_gelu_bad(), off_device="bias")


# --- add_layer_norm: x and residual (..., C), weight (C) or None, bias (C) or None -------------


def _add_layer_norm_good():
    return rand(4, 6), rand(4, 6), rand(6), rand(6)


def _add_layer_norm_bad():
    x, r, w, b = _add_layer_norm_good()
    return {
        "x_float16": Bad((x.half(), r.half(), w.half(), b.half()), "x", WHAT_DTYPE,
                         raw_only=True),
        "x_int": Bad((x.long(), r.long(), None, None), "x", WHAT_DTYPE),
        "residual_float64": Bad((x, r.double(), w, b), "residual", WHAT_DTYPE),
        "residual_shape": Bad((x, rand(4, 5), w, b), "residual", WHAT_SIZE),
        "residual_broadcast": Bad((x, rand(1, 6), w, b), "residual", WHAT_SIZE),
        "weight_float64": Bad((x, r, w.double(), b), "weight", WHAT_DTYPE),
        "weight_len": Bad((x, r, rand(7), b), "weight", WHAT_SIZE),
        "bias_2d": Bad((x, r, w, b.unsqueeze(0)), "bias", WHAT_RANK),
        "x_0d": Bad((torch.tensor(1.0), torch.tensor(1.0), None, None), "x", WHAT_RANK),
    }


ADD_LAYER_NORM = Contract("add_layer_norm", ("x", "residual", "weight", "bias"),
                          options=(1e-5,),  # eps
                          good=_add_layer_norm_good, bad=_add_layer_norm_bad(),
                          off_device="residual")
