"""pygpt.ops.cross_entropy / torch.ops.pygpt.cross_entropy against the explicit-math reference and
ATen's F.cross_entropy, without label smoothing and with it (s = 0.1 and s = 1)."""

import pytest
import torch
import torch.nn.functional as F

import pygpt.kernels
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

SMOOTHING = [0.0, 0.1, 1.0]  # label_smoothing: none, some, all (the target's own term weighs 0)


def make_targets(N, V, ignore, ignore_index=-100):
    t = torch.randint(0, V, (N,))
    if ignore == "some":
        t[::3] = ignore_index  # row 0 always ignored; N > 1 keeps some rows
    elif ignore == "all":
        t[:] = ignore_index
    return t


def check_fwd_bwd(logits, targets, ignore_index, tol, what="", grad_scale=1.0, smoothing=0.0):
    dtype = logits.dtype
    what = f"{what} smoothing={smoothing}"
    loss = pygpt.ops.cross_entropy(logits, targets, ignore_index=ignore_index,
                                   label_smoothing=smoothing)
    loss2, lse = raw(logits, targets, ignore_index, smoothing)
    assert loss.dtype == dtype and loss.shape == ()
    assert lse.dtype == dtype and lse.shape == (logits.shape[0],)
    torch.testing.assert_close(loss, loss2, atol=0, rtol=0, equal_nan=True)

    rl = f64(logits)
    rloss, rlse = ref.cross_entropy(rl, targets, ignore_index, smoothing)
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


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", IGNORE)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_vs_reference(shape, ignore, dtype, smoothing):
    N, V = shape
    logits = rand(N, V, dtype=dtype, requires_grad=True)
    targets = make_targets(N, V, ignore)
    check_fwd_bwd(logits, targets, -100, TOL[dtype], f"{shape} ignore={ignore}",
                  smoothing=smoothing)


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore_index", [0, 3, -1, 1000])
def test_custom_ignore_index(ignore_index, dtype, smoothing):
    # ignore_index may be a valid class id (0, 3); ignore_index outside [0, V) that appears in
    # the targets (-1, 1000) is not an out-of-range target.
    N, V = 40, 11
    logits = rand(N, V, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    targets[::4] = ignore_index
    if 0 <= ignore_index < V:
        # Rows whose target is this class id must count as ignored.
        assert (targets == ignore_index).sum() > N // 4
    check_fwd_bwd(logits, targets, ignore_index, TOL[dtype], f"ignore_index={ignore_index}",
                  smoothing=smoothing)
    # -100 is then an ordinary (out-of-range) value, not ignored.
    if ignore_index != -100:
        bad = targets.clone()
        bad[1] = -100
        with raises_naming("target*", WHAT_RANGE):
            pygpt.ops.cross_entropy(logits, bad, ignore_index=ignore_index)


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grad_scale", [2.5, -0.3])
def test_upstream_gradient_scale(grad_scale, dtype, smoothing):
    logits = rand(9, 17, dtype=dtype, requires_grad=True)
    targets = make_targets(9, 17, "some")
    check_fwd_bwd(logits, targets, -100, TOL[dtype], f"grad_scale={grad_scale}", grad_scale,
                  smoothing)


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_are_stable(dtype, smoothing):
    # Logits around +-1e4 overflow exp without the max subtraction.
    logits = (torch.randn(16, 300, dtype=dtype) * 50 + 1e4).requires_grad_()
    logits.data[::2] -= 2e4
    targets = torch.randint(0, 300, (16,))
    loss, lse = raw(logits, targets, -100, smoothing)
    assert torch.isfinite(loss) and torch.isfinite(lse).all()
    rloss, rlse = ref.cross_entropy(f64(logits), targets, label_smoothing=smoothing)
    tol = dict(atol=1e-3, rtol=1e-5) if dtype == torch.float32 else TOL[dtype]
    close(loss, rloss, tol, "loss")
    close(lse, rlse, tol, "lse")  # |lse| ~ 1e4: float32 ulp there is ~1e-3


@pytest.mark.parametrize("smoothing", SMOOTHING)
def test_all_ignored_matches_pytorch(smoothing):
    logits = rand(6, 10, requires_grad=True)
    alogits = logits.detach().clone().requires_grad_()
    targets = torch.full((6,), -100)
    loss = pygpt.ops.cross_entropy(logits, targets, label_smoothing=smoothing)
    expect = F.cross_entropy(alogits, targets, label_smoothing=smoothing)
    assert torch.isnan(loss) and torch.isnan(expect)
    loss.backward()
    expect.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    assert torch.equal(alogits.grad, logits.grad)


@pytest.mark.parametrize("smoothing", SMOOTHING)
def test_v1_loss_is_zero(smoothing):
    logits = rand(8, 1, requires_grad=True)
    loss = pygpt.ops.cross_entropy(logits, torch.zeros(8, dtype=torch.long),
                                   label_smoothing=smoothing)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


# Rows holding NaN, +inf or -inf (the native tests' table, tests/native/cross_entropy_cases.h),
# and their targets (-100: ignored).
INF, NAN = float("inf"), float("nan")
NON_FINITE_ROWS = [
    ([0, 1, 2, 3, 4], 2),  # finite
    ([-INF] * 5, 0),  # all -inf: NaN
    ([0, NAN, 2, 3, 4], 1),  # NaN
    ([0, 1, INF, 3, 4], 4),  # +inf: NaN
    ([0, NAN, INF, 3, 4], -100),  # NaN and +inf, ignored
    ([-INF, 1, -INF, 3, -INF], 1),  # partly -inf: finite; +inf with smoothing (the mean is -inf)
    ([-INF, NAN, -INF, -INF, -INF], 3),  # NaN among -inf
]


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [[0], [1], [2], [3], [5], [6], [0, 5], [0, 4, 5], "all"], ids=str)
def test_non_finite_rows_vs_aten(rows, dtype, smoothing):
    # As F.cross_entropy in loss and gradient, but for one thing: an ignored row's gradient is
    # zero whatever it holds, where ATen's is NaN for a row holding NaN or +inf.
    rows = range(len(NON_FINITE_ROWS)) if rows == "all" else rows
    logits = torch.tensor([NON_FINITE_ROWS[i][0] for i in rows], dtype=dtype, requires_grad=True)
    targets = torch.tensor([NON_FINITE_ROWS[i][1] for i in rows])
    alogits = logits.detach().clone().requires_grad_()
    loss = pygpt.ops.cross_entropy(logits, targets, label_smoothing=smoothing)
    expect = F.cross_entropy(alogits, targets, label_smoothing=smoothing)
    close(loss, expect, TOL[dtype], "loss")
    loss.backward()
    expect.backward()
    ignored = targets == -100
    assert torch.equal(logits.grad[ignored], torch.zeros_like(logits.grad[ignored]))
    close(logits.grad[~ignored], alogits.grad[~ignored], TOL[dtype], "dlogits")


# ---------------------------------------------------------------------------------------------
# Against ATen


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", IGNORE)
@pytest.mark.parametrize("shape", SHAPES + [(3072, 65), (8, 50257), (33, 1), (100, 777)], ids=str)
def test_vs_aten(shape, ignore, dtype, smoothing):
    N, V = shape
    logits = rand(N, V, dtype=dtype, requires_grad=True)
    alogits = logits.detach().clone().requires_grad_()
    targets = make_targets(N, V, ignore)
    loss = pygpt.ops.cross_entropy(logits, targets, label_smoothing=smoothing)
    expect = F.cross_entropy(alogits, targets, label_smoothing=smoothing)
    tol = TOL[dtype]
    close(loss, expect, tol, "loss vs aten")
    loss.backward()
    expect.backward()
    close(logits.grad, alogits.grad, tol, "dlogits vs aten")


@pytest.mark.parametrize("smoothing", SMOOTHING)
def test_vs_aten_custom_ignore_index(smoothing):
    logits = rand(50, 20, dtype=torch.float64, requires_grad=True)
    alogits = logits.detach().clone().requires_grad_()
    targets = torch.randint(0, 20, (50,))
    loss = pygpt.ops.cross_entropy(logits, targets, ignore_index=7, label_smoothing=smoothing)
    expect = F.cross_entropy(alogits, targets, ignore_index=7, label_smoothing=smoothing)
    close(loss, expect, TOL[torch.float64], "loss")
    loss.backward()
    expect.backward()
    close(logits.grad, alogits.grad, TOL[torch.float64], "dlogits")


# ---------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["row_stride", "transposed", "strided_targets", "expanded"])
def test_non_contiguous(layout, dtype, smoothing):
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
    check_fwd_bwd(logits, targets, -100, TOL[dtype], layout, smoothing=smoothing)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_inputs_not_modified(smoothing):
    logits = rand(10, 30, requires_grad=True)
    targets = make_targets(10, 30, "some")
    copies = logits.detach().clone(), targets.clone()
    pygpt.ops.cross_entropy(logits, targets, label_smoothing=smoothing).backward()
    assert torch.equal(logits.detach(), copies[0]) and torch.equal(targets, copies[1])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_two_threads_match_one_thread(two_threads, smoothing):
    results = []
    for on in (False, True):
        two_threads(on)
        torch.manual_seed(1)
        logits = rand(2048, 513, requires_grad=True)
        targets = make_targets(2048, 513, "some")
        loss, lse = raw(logits, targets, -100, smoothing)
        loss.backward()
        results.append((loss, lse, logits.grad))
    (l1, lse1, g1), (l2, lse2, g2) = results
    # The loss is a sum over row ranges (order may follow the split); rows are independent.
    close(l2, l1, TOL[torch.float32], "loss")
    assert torch.equal(lse1, lse2), "lse differs between 1 and 2 threads"
    assert torch.equal(g1, g2), "grad differs between 1 and 2 threads"


# ---------------------------------------------------------------------------------------------
# Autograd / registration checks


@pytest.mark.parametrize("smoothing", SMOOTHING)
@pytest.mark.parametrize("case", [
    (4, 5, "some", -100),
    (3, 1, "none", -100),
    (6, 7, "none", 2),
    (1, 3, "none", -100),
], ids=str)
def test_gradcheck(case, smoothing):
    N, V, ignore, ignore_index = case
    logits = rand(N, V, dtype=torch.float64, requires_grad=True)
    targets = make_targets(N, V, ignore, ignore_index)
    fn = lambda x: pygpt.ops.cross_entropy(x, targets, ignore_index=ignore_index,  # noqa: E731
                                           label_smoothing=smoothing)
    assert torch.autograd.gradcheck(fn, (logits,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", [
    ((8, 11), torch.float32, "some", -100, True, 0.0),
    ((5, 3), torch.float64, "none", 1, True, 0.0),
    ((7, 9), torch.float32, "none", -100, False, 0.0),
    ((8, 11), torch.float32, "some", -100, True, 0.1),
    ((5, 3), torch.float64, "none", 1, True, 1.0),
    ((7, 9), torch.float32, "none", -100, False, 0.1),
], ids=str)
def test_opcheck(case):
    (N, V), dtype, ignore, ignore_index, rg, smoothing = case
    logits = rand(N, V, dtype=dtype, requires_grad=rg)
    targets = make_targets(N, V, ignore, ignore_index)
    torch.library.opcheck(torch.ops.pygpt.cross_entropy.default,
                          (logits, targets, ignore_index, smoothing))


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


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("smoothing", [-0.1, -1e-300, 1.0000001, 2.0, NAN, INF, -INF])
def test_bad_label_smoothing(smoothing, device):
    # label_smoothing must be finite and in [0, 1] (F.cross_entropy takes negatives and NaN):
    # a ValueError naming it from the public function, the raw forward and backward ops, and
    # their fakes (meta tensors), before any work.
    x = rand(5, 4, requires_grad=True).to(device)
    t = torch.tensor([0, 1, 3, 2, -100]).to(device)
    lse = torch.zeros(5).to(device)
    calls = [lambda: pygpt.ops.cross_entropy(x, t, label_smoothing=smoothing),
             lambda: raw(x, t, -100, smoothing),
             lambda: torch.ops.pygpt.cross_entropy_backward(torch.ones(()).to(device), x, t, lse,
                                                            -100, smoothing)]
    for call in calls:
        with pytest.raises(ValueError, match=r"\blabel_smoothing\b.*\[0, 1\]"):
            call()


@pytest.mark.parametrize("smoothing", SMOOTHING)
def test_torch_kernels_match(smoothing):
    # The reference kernel set (plain PyTorch) takes label_smoothing as ours does.
    logits = rand(20, 9, requires_grad=True)
    targets = make_targets(20, 9, "some", ignore_index=4)
    ours, theirs = (pygpt.kernels.kernels(name).cross_entropy for name in ("ext", "torch"))
    close(ours(logits, targets, 4, smoothing), theirs(logits, targets, 4, smoothing),
          TOL[torch.float32], "loss")
    close(ours(logits, targets, ignore_index=4, label_smoothing=smoothing),
          theirs(logits, targets, ignore_index=4, label_smoothing=smoothing), TOL[torch.float32],
          "loss by keyword")
