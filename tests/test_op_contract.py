"""The op-boundary contract, checked the same way for every pygpt op.

Every op of pygpt.ops.registry rejects bad input at its boundary -- wrong dtype, rank or size, an
out-of-range value, a tensor on another device -- with an error whose message names the
offending argument and says what was expected. This holds through the public wrapper
(`pygpt.ops.*`) and the raw op (`torch.ops.pygpt.*`); the device check is also run on the CPU
kernel directly, since through the dispatcher a meta tensor is routed to the fake implementation
instead.

Each op has one or more `Contract`s (tests/contracts.py; those of attention, layer_norm,
cross_entropy and rotary here, of bias_gelu and add_layer_norm in tests/fused_contracts.py): the
names of its tensor arguments, the raw op's other arguments (the public wrapper's defaults),
valid inputs, its bad-input cases and the argument moved off the CPU for the bad-device case.
`test_bad_input` and `test_bad_device` run over all of them, op by op in the registry's order,
and `test_every_op_has_a_contract` makes sure that a new op gets one. Op-specific checks that do
not fit the table stay in the op's own test file (e.g.
test_cross_entropy.test_bad_target_backward_path).
"""

import pytest
import torch

import pygpt.ops
from contracts import CALLERS, Bad, Contract
from fused_contracts import ADD_LAYER_NORM, BIAS_GELU
from helpers import WHAT_DEVICE, WHAT_DTYPE, WHAT_RANGE, WHAT_RANK, WHAT_SIZE, raises_naming, rand
from pygpt.ops.registry import OPS


# --- attention: q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv) -----------------------------------


def _attention_good():
    B, H, Tq, Tk, Dk, Dv = 2, 3, 5, 6, 4, 7
    return rand(B, H, Tq, Dk), rand(B, H, Tk, Dk), rand(B, H, Tk, Dv)


def _attention_bad():
    q, k, v = _attention_good()
    return {
        "q_float16": Bad((q.half(), k, v), "q", WHAT_DTYPE),
        "q_bfloat16": Bad((q.bfloat16(), k.bfloat16(), v.bfloat16()), "q", WHAT_DTYPE,
                          raw_only=True),
        "q_int": Bad((q.long(), k, v), "q", WHAT_DTYPE),
        "k_float64": Bad((q, k.double(), v), "k", WHAT_DTYPE),
        "v_float64": Bad((q, k, v.double()), "v", WHAT_DTYPE),
        "q_rank3": Bad((q[0], k, v), "q", WHAT_RANK),
        "k_rank5": Bad((q, k.unsqueeze(0), v), "k", WHAT_RANK),
        "v_rank3": Bad((q, k, v[0]), "v", WHAT_RANK),
        "k_batch": Bad((q, k[:1], v), "k", WHAT_SIZE),
        "v_batch": Bad((q, k, v[:1]), "v", WHAT_SIZE),
        "k_heads": Bad((q, k[:, :2], v), "k", WHAT_SIZE),
        "v_heads": Bad((q, k, v[:, :1]), "v", WHAT_SIZE),
        "v_Tk": Bad((q, k, v[:, :, :5]), "v", WHAT_SIZE),
        "k_Dk": Bad((q, k[..., :3], v), "k", WHAT_SIZE),
    }


ATTENTION = Contract("attention", ("q", "k", "v"), options=(True, None),  # causal, scale
                     good=_attention_good, bad=_attention_bad(), off_device="k")


# --- attention's lengths: int32/int64 (B,) on q's device, in [0, Tq] and [0, Tk] --------------


def _lengths_good():
    q, k, v = _attention_good()  # B=2, Tq=5, Tk=6
    return q, k, v, torch.tensor([5, 0]), torch.tensor([6, 1], dtype=torch.int32)


def _lengths_bad():
    q, k, v, ql, kl = _lengths_good()
    return {
        "q_lengths_float": Bad((q, k, v, ql.float(), kl), "q_lengths", WHAT_DTYPE + "|int"),
        "kv_lengths_int16": Bad((q, k, v, ql, kl.short()), "kv_lengths", WHAT_DTYPE + "|int"),
        "q_lengths_2d": Bad((q, k, v, ql[None], kl), "q_lengths", WHAT_RANK),
        "kv_lengths_short": Bad((q, k, v, ql, kl[:1]), "kv_lengths", WHAT_SIZE),
        "q_lengths_negative": Bad((q, k, v, torch.tensor([-1, 2]), kl), "q_lengths", WHAT_RANGE),
        "q_lengths_past_Tq": Bad((q, k, v, torch.tensor([6, 2]), kl), "q_lengths", WHAT_RANGE),
        "kv_lengths_past_Tk": Bad((q, k, v, ql, torch.tensor([0, 7])), "kv_lengths", WHAT_RANGE),
        "kv_lengths_huge": Bad((q, k, v, None, torch.tensor([2**40, 1])), "kv_lengths", WHAT_RANGE),
    }


ATTENTION_LENGTHS = Contract("attention", ("q", "k", "v", "q_lengths", "kv_lengths"),
                             options=(True, None), good=_lengths_good, bad=_lengths_bad(),
                             off_device="kv_lengths", keywords=("q_lengths", "kv_lengths"),
                             label="attention_lengths")


# --- attention's position biases: rel_bias (H, 2R + 1), alibi_slopes (H,), q's dtype/device --


def _bias_good():
    q, k, v = _attention_good()  # H=3
    return q, k, v, None, None, rand(3, 5), rand(3)


def _bias_bad():
    q, k, v, ql, kl, table, slopes = _bias_good()
    return {
        "rel_bias_float64": Bad((q, k, v, ql, kl, table.double(), slopes), "rel_bias", WHAT_DTYPE),
        "rel_bias_1d": Bad((q, k, v, ql, kl, table[0], slopes), "rel_bias", WHAT_RANK),
        "rel_bias_heads": Bad((q, k, v, ql, kl, rand(2, 5), slopes), "rel_bias", WHAT_SIZE),
        "rel_bias_even": Bad((q, k, v, ql, kl, rand(3, 4), None), "rel_bias", WHAT_SIZE + "|odd"),
        "alibi_slopes_int": Bad((q, k, v, ql, kl, None, slopes.long()), "alibi_slopes",
                                WHAT_DTYPE),
        "alibi_slopes_2d": Bad((q, k, v, ql, kl, table, slopes[None]), "alibi_slopes", WHAT_RANK),
        "alibi_slopes_heads": Bad((q, k, v, ql, kl, None, rand(4)), "alibi_slopes", WHAT_SIZE),
    }


_BIAS_ARGS = dict(arg_names=("q", "k", "v", "q_lengths", "kv_lengths", "rel_bias", "alibi_slopes"),
                  options=(True, None), good=_bias_good,
                  keywords=("q_lengths", "kv_lengths", "rel_bias", "alibi_slopes"))
ATTENTION_REL_BIAS = Contract("attention", bad=_bias_bad(), off_device="rel_bias",
                              label="attention_rel_bias", **_BIAS_ARGS)
ATTENTION_ALIBI = Contract("attention", bad={}, off_device="alibi_slopes",
                           label="attention_alibi", **_BIAS_ARGS)


# --- layer_norm: x (..., C), weight (C) or None, bias (C) or None -----------------------------


def _layer_norm_good():
    return rand(4, 6), rand(6), rand(6)


def _layer_norm_bad():
    x, w, b = _layer_norm_good()
    return {
        "x_float16": Bad((x.half(), w.half(), b.half()), "x", WHAT_DTYPE, raw_only=True),
        "x_int": Bad((x.long(), None, None), "x", WHAT_DTYPE),
        "weight_float64": Bad((x, w.double(), b), "weight", WHAT_DTYPE),
        "bias_float64": Bad((x, w, b.double()), "bias", WHAT_DTYPE),
        "bias_float64_no_weight": Bad((x, None, b.double()), "bias", WHAT_DTYPE),
        "weight_int": Bad((x, w.long(), b), "weight", WHAT_DTYPE),
        "weight_len": Bad((x, rand(7), b), "weight", WHAT_SIZE),
        "weight_2d": Bad((x, w.unsqueeze(0), b), "weight", WHAT_RANK),
        "bias_len": Bad((x, w, rand(5)), "bias", WHAT_SIZE),
        "bias_2d_no_weight": Bad((x, None, b.reshape(2, 3)), "bias", WHAT_RANK),
        "x_0d": Bad((torch.tensor(1.0), None, None), "x", WHAT_RANK),
    }


LAYER_NORM = Contract("layer_norm", ("x", "weight", "bias"), options=(1e-5,),  # eps
                      good=_layer_norm_good, bad=_layer_norm_bad(), off_device="weight")


# --- cross_entropy: logits (N, V), targets (N,) int64 in [0, V) -------------------------------


def _cross_entropy_good():
    return rand(6, 10), torch.randint(0, 10, (6,))


def _with_target(t, row, value):
    t = t.clone()
    t[row] = value
    return t


def _cross_entropy_bad():
    x, t = _cross_entropy_good()
    big_x, big_t = rand(3000, 7), torch.randint(0, 7, (3000,))
    what_index_dtype = WHAT_DTYPE + "|int|long"
    return {
        "logits_1d": Bad((x[0], t[:1]), "logits", WHAT_RANK),
        "logits_3d": Bad((x.unsqueeze(0), t), "logits", WHAT_RANK),
        "logits_float16": Bad((x.half(), t), "logits", WHAT_DTYPE, raw_only=True),
        "logits_int": Bad((x.long(), t), "logits", WHAT_DTYPE),
        "targets_int32": Bad((x, t.int()), "targets", what_index_dtype),
        "targets_float": Bad((x, t.float()), "targets", what_index_dtype),
        "targets_2d": Bad((x, t.unsqueeze(1)), "targets", WHAT_RANK),
        "targets_short": Bad((x, t[:5]), "targets", WHAT_SIZE),
        "targets_long": Bad((x, torch.cat([t, t[:1]])), "targets", WHAT_SIZE),
        "target_eq_V": Bad((x, _with_target(t, 3, 10)), "target*", WHAT_RANGE),
        "target_negative": Bad((x, _with_target(t, 5, -1)), "target*", WHAT_RANGE),
        "target_huge": Bad((x, _with_target(t, 0, 2**40)), "target*", WHAT_RANGE),
        "target_last_row_big": Bad((big_x, _with_target(big_t, 2999, 7)), "target*", WHAT_RANGE),
    }


CROSS_ENTROPY = Contract("cross_entropy", ("logits", "targets"),
                         options=(-100, 0.0),  # ignore_index, label_smoothing
                         good=_cross_entropy_good, bad=_cross_entropy_bad(), off_device="targets")


# --- rotary: x (B,H,T,D), cos and sin (max_pos, half) with 2 * half <= D, positions int64 ----


def _rotary_good():
    B, H, T, D, half, max_pos = 2, 3, 5, 8, 3, 12
    positions = torch.randint(0, max_pos, (B, T))
    return rand(B, H, T, D), rand(max_pos, half), rand(max_pos, half), positions


def _rotary_bad():
    x, c, s, p = _rotary_good()
    what_positions_dtype = WHAT_DTYPE + "|int64"
    return {
        "x_float16": Bad((x.half(), c.half(), s.half(), p), "x", WHAT_DTYPE, raw_only=True),
        "x_int": Bad((x.long(), c, s, p), "x", WHAT_DTYPE),
        "x_rank3": Bad((x[0], c, s, p[0]), "x", WHAT_RANK),
        "cos_float64": Bad((x, c.double(), s, p), "cos", WHAT_DTYPE),
        "sin_float64": Bad((x, c, s.double(), p), "sin", WHAT_DTYPE),
        "cos_rank1": Bad((x, c[0], s[0], p), "cos", WHAT_RANK),
        "sin_shape": Bad((x, c, s[:, :2], p), "sin", WHAT_SIZE),
        "cos_too_wide": Bad((x, rand(12, 5), rand(12, 5), p), "cos", WHAT_SIZE),
        "positions_int32": Bad((x, c, s, p.int()), "positions", what_positions_dtype),
        "positions_float": Bad((x, c, s, p.float()), "positions", what_positions_dtype),
        "positions_rank3": Bad((x, c, s, p[None]), "positions", WHAT_RANK),
        "positions_T": Bad((x, c, s, p[:, :4]), "positions", WHAT_SIZE),
        "positions_B": Bad((x, c, s, p[:1]), "positions", WHAT_SIZE),
        "positions_negative": Bad((x, c, s, p - 20), "positions", WHAT_RANGE),
        "positions_past_table": Bad((x, c, s, torch.where(torch.arange(5) == 4, 12, p)),
                                    "positions", WHAT_RANGE),  # the table has rows 0 .. 11
    }


ROTARY = Contract("rotary", ("x", "cos", "sin", "positions"), options=(False,),  # inverse
                  good=_rotary_good, bad=_rotary_bad(), off_device="positions")


ALL_CONTRACTS = (ATTENTION, ATTENTION_LENGTHS, ATTENTION_REL_BIAS, ATTENTION_ALIBI, LAYER_NORM,
                 CROSS_ENTROPY, ROTARY, BIAS_GELU, ADD_LAYER_NORM)
# Ops whose boundary is checked elsewhere, and why.
CHECKED_ELSEWHERE = {
    "linear_cross_entropy": "its raw op's other arguments (chunk_rows, the gradient flags) are "
                            "the public wrapper's choice, not defaults: see test_linear_cross_"
                            "entropy.test_bad_input_names_the_argument",
}
CONTRACTS = {c.key: c for op in OPS for c in ALL_CONTRACTS if c.name == op.name}

BAD_CASES = [pytest.param(op, case, id=f"{op}-{case}")
             for op, contract in CONTRACTS.items() for case in contract.bad]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("op, case", BAD_CASES)
def test_bad_input(op, case, caller):
    args, arg, what, raw_only = CONTRACTS[op].bad[case]
    if raw_only and caller == "public":
        outputs = CONTRACTS[op].call(caller, *args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        assert all(t.dtype == args[0].dtype for t in outputs), [t.dtype for t in outputs]
        return
    with raises_naming(arg, what):
        CONTRACTS[op].call(caller, *args)


@pytest.mark.parametrize("caller", CALLERS + ("cpu_kernel",))
@pytest.mark.parametrize("op", list(CONTRACTS))
def test_bad_device(op, caller):
    # A meta tensor stands in for "not on the CPU", mixed with CPU tensors. Through the dispatcher
    # ("public", "raw") such a call is routed to the fake/meta implementation, which must still
    # refuse mixed devices (ATen's meta functions do: "Tensor on device meta is not on the expected
    # device cpu!"); "cpu_kernel" calls the CPU kernel directly, which checks devices itself.
    contract = CONTRACTS[op]
    args = list(contract.good())
    i = contract.arg_names.index(contract.off_device)
    args[i] = args[i].to("meta")
    with raises_naming(contract.off_device, WHAT_DEVICE):
        contract.call(caller, *args)


@pytest.mark.parametrize("op", [op.name for op in OPS])
def test_every_op_has_a_contract(op):
    assert op in {c.name for c in CONTRACTS.values()} or op in CHECKED_ELSEWHERE, (
        f"pygpt.ops.{op} has no Contract: add one to ALL_CONTRACTS")


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_the_public_function_is_the_registrys(op):
    assert getattr(pygpt.ops, op.name) is op.function and op.name in pygpt.ops.__all__
