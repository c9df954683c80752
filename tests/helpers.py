"""Small helpers shared by the test modules (tolerances, random inputs)."""

import torch

# (atol, rtol) per dtype. float32 results are compared against references evaluated in float64.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
}
ATTN_TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
}

DTYPES = [torch.float32, torch.float64]


def close(actual, expected, tol, msg="", rel_to_max=False):
    """assert_close against a (possibly higher-precision) reference, reporting the max error.

    rel_to_max: scale atol by max(1, max|expected|), for results that are long sums (e.g. weight
    gradients reduced over many rows) where elementwise relative error is meaningless near 0.
    """
    if rel_to_max:
        tol = dict(tol, atol=tol["atol"] * max(1.0, expected.detach().abs().max().item()))
    expected = expected.to(actual.dtype)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
    except AssertionError as e:
        finite = torch.isfinite(expected) & torch.isfinite(actual)
        err = (actual - expected)[finite].abs().max().item() if finite.any() else float("nan")
        raise AssertionError(f"{msg}: max abs error {err:.3e} ({actual.dtype}, shape "
                             f"{tuple(actual.shape)})\n{e}") from None


def f64(*ts):
    """Detached float64 copies that require grad (for the reference)."""
    out = tuple(t.detach().double().requires_grad_(t.requires_grad) for t in ts)
    return out if len(out) > 1 else out[0]


def rand(*shape, dtype=torch.float32, requires_grad=False, scale=1.0):
    t = torch.randn(*shape, dtype=dtype) * scale
    return t.requires_grad_(requires_grad)


def raises_naming(arg, what):
    """pytest.raises for a RuntimeError/ValueError whose message names `arg` (as a whole word,
    or as a prefix when arg ends with '*') and also matches the regex `what` (case-insensitive),
    which describes what was expected (dtype, shape, ...)."""
    import pytest

    name = rf"\b{arg[:-1]}" if arg.endswith("*") else rf"\b{arg}\b"
    return pytest.raises((RuntimeError, ValueError), match=rf"(?s)^(?=.*{name})(?=.*(?i:{what}))")


# Regexes for "what was expected" in error messages.
WHAT_DTYPE = r"float|double|dtype|type"
WHAT_RANK = r"dim|rank|\dd\b|\d-d|shape|size"
WHAT_SIZE = r"size|shape|dim|match|same|expect|must|but"
WHAT_DEVICE = r"cpu|device"
WHAT_RANGE = r"range|bound|valid|\[0|>=|<|class|index"
