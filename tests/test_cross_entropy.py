"""pygpt.ops.cross_entropy / torch.ops.pygpt.cross_entropy against the explicit-math reference and
ATen's F.cross_entropy."""

import pytest
import torch
import torch.nn.functional as F

import pygpt.ops
import reference as ref
from helpers import DTYPES, TOL, WHAT_RANGE, close, f64, raises_naming, rand

raw = torch.ops.pygpt.cross_entropy

SHAPES = [
    (1, 1),  # V = 1: loss is exactly 0
    (5, 1),
    (1, 2),
    (7, 13),
    (33, 65),
    (128, 1000),
    (3, 2048),
    (5, 2049),
    (17, 4097),
    (4, 50257),  # GPT-2 vocabulary
]

IGNORE = ["none", "some", "all"]


def make_targets(N, V, ignore, ignore_index=-100):
    t = torch.randint(0, V, (N,))
    if ignore == "some":
        t[::3] = ignore_index  # row 0 always ignored; N > 1 keeps some rows
    elif ignore == "all":
        t[:] = ignore_index
    return t


def check_fwd_bwd(logits, targets, ignore_index, tol, what="", grad_scale=1.0):
    dtype = logits.dtype
    loss = pygpt.ops.cross_entropy(logits, targets, ignore_index=ignore_index)
    loss2, lse = raw(logits, targets, ignore_index)
    assert loss.dtype == dtype and loss.shape == ()
    assert lse.dtype == dtype and lse.shape == (logits.shape[0],)
    torch.testing.assert_close(loss, loss2, atol=0, rtol=0, equal_nan=True)

    rl = f64(logits)
    rloss, rlse = ref.cross_entropy(rl, targets, ignore_index)
    close(loss, rloss, tol, f"{what} loss")
    close(lse, rlse, tol, f"{what} lse")

    if logits.requires_grad:
        all_ignored = bool((targets == ignore_index).all())
        (loss * grad_scale).backward()
        if all_ignored:
            assert torch.isnan(loss)
            assert torch.equal(logits.grad, torch.zeros_like(logits)), "all-ignored grad not zero"
        else:
            (rloss * grad_scale).backward()
            close(logits.grad, rl.grad, tol, f"{what} dlogits")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", IGNORE)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_vs_reference(shape, ignore, dtype):
    N, V = shape
    logits = rand(N, V, dtype=dtype, requires_grad=True)
    targets = make_targets(N, V, ignore)
    check_fwd_bwd(logits, targets, -100, TOL[dtype], f"{shape} ignore={ignore}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore_index", [0, 3, -1, 1000])
def test_custom_ignore_index(ignore_index, dtype):
    # ignore_index may be a valid class id (0, 3); ignore_index outside [0, V) that appears in
    # the targets (-1, 1000) is not an out-of-range target.
    N, V = 40, 11
    logits = rand(N, V, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    targets[::4] = ignore_index
    if 0 <= ignore_index < V:
        # Rows whose target is this class id must count as ignored.
        assert (targets == ignore_index).sum() > N // 4
    check_fwd_bwd(logits, targets, ignore_index, TOL[dtype], f"ignore_index={ignore_index}")
    # -100 is then an ordinary (out-of-range) value, not ignored.
    if ignore_index != -100:
        bad = targets.clone()
        bad[1] = -100
        with raises_naming("target*", WHAT_RANGE):
            pygpt.ops.cross_entropy(logits, bad, ignore_index=ignore_index)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grad_scale", [2.5, -0.3])
def test_upstream_gradient_scale(grad_scale, dtype):
    logits = rand(9, 17, dtype=dtype, requires_grad=True)
    targets = make_targets(9, 17, "some")
    check_fwd_bwd(logits, targets, -100, TOL[dtype], f"grad_scale={grad_scale}", grad_scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_are_stable(dtype):
    # Logits around +-1e4 overflow exp without the max subtraction.
    logits = (torch.randn(16, 300, dtype=dtype) * 50 + 1e4).requires_grad_()
    logits.data[::2] -= 2e4
    targets = torch.randint(0, 300, (16,))
    loss, lse = raw(logits, targets, -100)
    assert torch.isfinite(loss) and torch.isfinite(lse).all()
    rloss, rlse = ref.cross_entropy(f64(logits), targets)
    tol = dict(atol=1e-3, rtol=1e-5) if dtype == torch.float32 else TOL[dtype]
    close(loss, rloss, tol, "loss")
    close(lse, rlse, tol, "lse")  # |lse| ~ 1e4: float32 ulp there is ~1e-3


def test_all_ignored_matches_pytorch():
    logits = rand(6, 10, requires_grad=True)
    targets = torch.full((6,), -100)
    loss = pygpt.ops.cross_entropy(logits, targets)
    expect = F.cross_entropy(logits, targets)
    assert torch.isnan(loss) and torch.isnan(expect)
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_v1_loss_is_zero():
    logits = rand(8, 1, requires_grad=True)
    loss = pygpt.ops.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


# ---------------------------------------------------------------------------------------------
# Against ATen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", ["none", "some"])
@pytest.mark.parametrize("shape", [(3072, 65), (8, 50257), (33, 1), (100, 777)], ids=str)
def test_vs_aten(shape, ignore, dtype):
    N, V = shape
    logits = rand(N, V, dtype=dtype, requires_grad=True)
    alogits = logits.detach().clone().requires_grad_()
    targets = make_targets(N, V, ignore)
    loss = pygpt.ops.cross_entropy(logits, targets)
    expect = F.cross_entropy(alogits, targets)
    tol = TOL[dtype]
    close(loss, expect, tol, "loss vs aten")
    loss.backward()
    expect.backward()
    close(logits.grad, alogits.grad, tol, "dlogits vs aten")


def test_vs_aten_custom_ignore_index():
    logits = rand(50, 20, dtype=torch.float64, requires_grad=True)
    alogits = logits.detach().clone().requires_grad_()
    targets = torch.randint(0, 20, (50,))
    loss = pygpt.ops.cross_entropy(logits, targets, ignore_index=7)
    expect = F.cross_entropy(alogits, targets, ignore_index=7)
    close(loss, expect, TOL[torch.float64], "loss")
    loss.backward()
    expect.backward()
    close(logits.grad, alogits.grad, TOL[torch.float64], "dlogits")


# ---------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["row_stride", "transposed", "strided_targets", "expanded"])
def test_non_contiguous(layout, dtype):
    N, V = 24, 37
    targets = make_targets(N, V, "some")
    if layout == "row_stride":
        logits = torch.randn(N, V + 5, dtype=dtype)[:, 2:V + 2]
    elif layout == "transposed":
        logits = torch.randn(V, N, dtype=dtype).t()
    elif layout == "strided_targets":
        logits = torch.randn(N, V, dtype=dtype)
        t2 = torch.randint(0, V, (2 * N,))
        t2[::2] = targets
        targets = t2[::2]
        assert not targets.is_contiguous()
    else:
        logits = torch.randn(1, V, dtype=dtype).expand(N, V)
    logits.requires_grad_()
    check_fwd_bwd(logits, targets, -100, TOL[dtype], layout)


def test_inputs_not_modified():
    logits = rand(10, 30, requires_grad=True)
    targets = make_targets(10, 30, "some")
    copies = logits.detach().clone(), targets.clone()
    pygpt.ops.cross_entropy(logits, targets).backward()
    assert torch.equal(logits.detach(), copies[0]) and torch.equal(targets, copies[1])


def test_two_threads_match_one_thread(two_threads):
    results = []
    for on in (False, True):
        two_threads(on)
        torch.manual_seed(1)
        logits = rand(2048, 513, requires_grad=True)
        targets = make_targets(2048, 513, "some")
        loss, lse = raw(logits, targets, -100)
        loss.backward()
        results.append((loss, lse, logits.grad))
    (l1, lse1, g1), (l2, lse2, g2) = results
    # The loss is a sum over row ranges (order may follow the split); rows are independent.
    close(l2, l1, TOL[torch.float32], "loss")
    assert torch.equal(lse1, lse2), "lse differs between 1 and 2 threads"
    assert torch.equal(g1, g2), "grad differs between 1 and 2 threads"


# ---------------------------------------------------------------------------------------------
# Autograd / registration checks


@pytest.mark.parametrize("case", [
    (4, 5, "some", -100),
    (3, 1, "none", -100),
    (6, 7, "none", 2),
    (1, 3, "none", -100),
], ids=str)
def test_gradcheck(case):
    N, V, ignore, ignore_index = case
    logits = rand(N, V, dtype=torch.float64, requires_grad=True)
    targets = make_targets(N, V, ignore, ignore_index)
    fn = lambda x: pygpt.ops.cross_entropy(x, targets, ignore_index=ignore_index)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logits,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", [
    ((8, 11), torch.float32, "some", -100, True),
    ((5, 3), torch.float64, "none", 1, True),
    ((7, 9), torch.float32, "none", -100, False),
], ids=str)
def test_opcheck(case):
    (N, V), dtype, ignore, ignore_index, rg = case
    logits = rand(N, V, dtype=dtype, requires_grad=rg)
    targets = make_targets(N, V, ignore, ignore_index)
    torch.library.opcheck(torch.ops.pygpt.cross_entropy.default, (logits, targets, ignore_index))


def test_opcheck_all_ignored():
    # The loss is nan here, and opcheck's eager-vs-AOTDispatcher comparison treats nan != nan, so
    # that one check is left out for this sample (the all-ignored values are tested above).
    logits = rand(4, 6, dtype=torch.float64, requires_grad=True)
    targets = make_targets(4, 6, "all")
    torch.library.opcheck(torch.ops.pygpt.cross_entropy.default, (logits, targets, -100),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


# ---------------------------------------------------------------------------------------------
# Bad input (the shared table of bad dtype/rank/size/range/device cases is in test_op_contract.py)


def test_bad_target_backward_path():
    # An out-of-range target must also be rejected when gradients are wanted.
    x = rand(5, 4, requires_grad=True)
    t = torch.tensor([0, 1, 4, 2, 3])
    with raises_naming("target*", WHAT_RANGE):
        pygpt.ops.cross_entropy(x, t).backward()
