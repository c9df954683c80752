#!/usr/bin/env python
"""Every pygpt op against what a GPU user would call instead, on the GPU, forward and
forward + backward, float32 and bfloat16, and attention in float16 too: the benchmark table of
benchmarks/gpu_check.sh.

Baselines: attention against PyTorch's SDPA under each of its flash, cuDNN and memory-efficient
backends (torch.nn.attention.sdpa_kernel; a backend that refuses a case is listed as n/a), at a
training shape (B=8 H=12 T=1024 D=64, causal), a long one (T=4096), a right-padded batch (ours
with lengths, SDPA with the equivalent mask) and a decode step (one query over 4096 keys); in
the 16-bit types, which run on the tensor-core kernels, also at head dim 128;
layer_norm against F.layer_norm, add_layer_norm against x + r then F.layer_norm, bias_gelu
against F.gelu(h + b), cross_entropy against F.cross_entropy (V=50257, with and without label
smoothing), rotary against the same math in plain PyTorch, and linear_cross_entropy against
F.linear then F.cross_entropy. The memory-bound ops' tensors are several times the L2 cache.

Timing: CUDA events around each call (on the CPU of --dry-run, time.perf_counter), after warm-up
calls; ours and every baseline of a case alternate call by call in one process, and each figure
is the median. Rates: TFLOP/s for attention and linear_cross_entropy (attention counts the useful
work: the causal half, a padded batch's real rows; its backward as 2.5 forwards), GB/s for the
memory-bound ops and the decode step: the fewest bytes the pass must move (each input read once,
each output written once; forward + backward adds the gradients read and written and the
inputs read again). Peak memory (cross_entropy, linear_cross_entropy): the most the CUDA
allocator held during one call above what was live before it. "rel. err" is ||ours - baseline||
/ ||baseline|| over the forward outputs, marked DIFFERS past 1e-4 (float32), 2e-2 (bfloat16) or
5e-3 (float16).
Above the table: the chip's two ceilings, a large device-to-device copy (bytes read + written)
and a large bfloat16 matrix product.

Usage:
  python benchmarks/gpu_bench.py --table bench.md            # on a GPU machine
  python benchmarks/gpu_bench.py --table bench.md --dry-run  # the same code, tiny, on the CPU
"""
import argparse
import statistics
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import pygpt.ops as ops
from bench_kernels import DTYPE_NAMES, cuda_peak_bytes, padded_lengths
from pygpt.nn.rotary import rotary_tables
from pygpt.ops.registry import OPS
from pygpt.ops.rotary import torch_rotary

SDPA = {"SDPA flash": SDPBackend.FLASH_ATTENTION, "SDPA cuDNN": SDPBackend.CUDNN_ATTENTION,
        "SDPA efficient": SDPBackend.EFFICIENT_ATTENTION}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
# The shapes: the GPU's, and --dry-run's tiny ones on the CPU.
SIZES = {
    "gpu": dict(attention=[(8, 12, 1024, 64), (8, 12, 4096, 64)],
                attention_16bit=[(8, 12, 1024, 128), (8, 12, 4096, 128)], decode=(8, 12, 4096, 64),
                norm=(65536, 768), gelu=(16384, 3072), logits=(8192, 50257),
                rotary=(64, 12, 1024, 64), head=(8192, 768, 50257)),
    "dry": dict(attention=[(2, 2, 64, 16)], attention_16bit=[(2, 2, 64, 32)],
                decode=(2, 2, 64, 16), norm=(32, 24),
                gelu=(16, 64), logits=(16, 100), rotary=(2, 2, 16, 8), head=(16, 32, 100)),
}
# The aims on an H100/H200: (what, the rows it holds for, time or memory, the largest
# ours/baseline ratio that meets it).
AIMS = [
    ("attention fwd+bwd in bf16 within 1.5x of SDPA flash", lambda r: r["op"] == "attention"
     and r["dtype"] == "bf16" and r["passes"] == "fwd+bwd" and r["baseline"] == "SDPA flash",
     "time", 1.5),
    ("layer_norm at least as fast as F.layer_norm", lambda r: r["op"] == "layer_norm", "time",
     1.0),
    ("cross_entropy at least as fast as F.cross_entropy", lambda r: r["op"] == "cross_entropy",
     "time", 1.0),
    ("cross_entropy at most half F.cross_entropy's peak memory",
     lambda r: r["op"] == "cross_entropy", "memory", 0.5),
]
COLUMNS = ["op", "shape", "dtype", "pass", "baseline", "ours ms", "baseline ms", "ours/baseline",
           "ours rate", "baseline rate", "rel. err", "peak MiB ours / baseline"]


@dataclass
class Case:
    """One op at one shape. ours and each baseline take `args` (forward, no gradients) or
    `grad_args` (forward + backward from `grad_out`; None: the output is a scalar loss); `work`
    holds each pass's FLOPs or bytes (None: the pass is not timed); `compared` picks what the
    rel. err compares of an output."""
    op: str
    shape: str
    unit: str  # "TFLOP/s" or "GB/s"
    work: tuple
    ours: Callable
    baselines: dict
    args: tuple
    grad_args: Optional[tuple] = None
    grad_out: object = None
    memory: bool = False
    compared: Callable = lambda out: out


def leaves(*tensors):
    """Copies of the floating tensors that require grad (the others as they are)."""
    return tuple(t.detach().clone().requires_grad_() if t.is_floating_point() else t
                 for t in tensors)


def under_each_sdpa_backend(fn):
    def under(backend):
        def call(*args):
            with sdpa_kernel(backend):
                return fn(*args)
        return call
    return {name: under(backend) for name, backend in SDPA.items()}


def attention_cases(shapes, dev, dt, padded=True):
    """Causal self-attention at each shape; padded: and a right-padded batch at the first."""
    for B, H, T, D in shapes:
        q, k, v, grad = (torch.randn(B, H, T, D, device=dev, dtype=dt) for _ in range(4))
        flops = 4 * B * H * T * T * D / 2
        yield Case("attention", f"B={B} H={H} T={T} D={D} causal", "TFLOP/s", (flops, 3.5 * flops),
                   ops.attention, under_each_sdpa_backend(
                       lambda *a: F.scaled_dot_product_attention(*a, is_causal=True)),
                   (q, k, v), leaves(q, k, v), grad)
    if not padded:
        return
    B, H, T, D = shapes[0]
    q, k, v, grad = (torch.randn(B, H, T, D, device=dev, dtype=dt) for _ in range(4))
    lengths = padded_lengths(B, T, dev)
    real = torch.arange(T, device=dev)[None, :] < lengths[:, None]  # (B, T)
    causal = torch.ones(T, T, device=dev, dtype=torch.bool).tril()
    mask = (real[:, :, None] & real[:, None, :] & causal)[:, None]  # (B, 1, T, T)
    flops = 4 * H * D * sum(n * (n + 1) / 2 for n in lengths.tolist())
    yield Case("attention", f"B={B} H={H} T={T} D={D} causal, right-padded "
               f"({real.float().mean().item():.0%} real) vs SDPA + mask", "TFLOP/s",
               (flops, 3.5 * flops),
               lambda *a: ops.attention(*a, q_lengths=lengths, kv_lengths=lengths),
               under_each_sdpa_backend(lambda *a: F.scaled_dot_product_attention(
                   *a, attn_mask=mask)),
               (q, k, v), leaves(q, k, v), grad,
               compared=lambda out: out.transpose(1, 2)[real])  # the real rows alone


def decode_case(B, H, keys, D, dev, dt):
    """One new query per row over a cache of `keys`: memory-bound (K and V read once)."""
    q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
    k, v = (torch.randn(B, H, keys, D, device=dev, dtype=dt) for _ in range(2))
    return Case("attention", f"decode B={B} H={H}, 1 query over {keys} keys, D={D}", "GB/s",
                (2 * k.numel() * k.element_size(), None), ops.attention,
                under_each_sdpa_backend(F.scaled_dot_product_attention), (q, k, v))


def norm_cases(N, C, dev, dt):
    e = torch.finfo(dt).bits // 8
    x, r, gy, gs = (torch.randn(N, C, device=dev, dtype=dt) for _ in range(4))
    w = 1 + 0.1 * torch.randn(C, device=dev, dtype=dt)
    b = 0.1 * torch.randn(C, device=dev, dtype=dt)
    yield Case("layer_norm", f"({N}, {C})", "GB/s", (2 * N * C * e, 5 * N * C * e),
               ops.layer_norm, {"F.layer_norm": lambda x, w, b: F.layer_norm(x, (C,), w, b)},
               (x, w, b), leaves(x, w, b), gy)
    # The sum's gradient comes back to x and to r alike: one tensor written.
    yield Case("add_layer_norm", f"({N}, {C})", "GB/s", (4 * N * C * e, 8 * N * C * e),
               ops.add_layer_norm,
               {"x + r, F.layer_norm": lambda x, r, w, b: (x + r, F.layer_norm(x + r, (C,), w, b))},
               (x, r, w, b), leaves(x, r, w, b), (gs, gy), compared=torch.cat)


def bias_gelu_case(N, C, dev, dt):
    h, grad = (torch.randn(N, C, device=dev, dtype=dt) for _ in range(2))
    b = torch.randn(C, device=dev, dtype=dt)
    e = h.element_size()
    return Case("bias_gelu", f"({N}, {C})", "GB/s", (2 * N * C * e, 5 * N * C * e),
                ops.bias_gelu, {"F.gelu(h + b)": lambda h, b: F.gelu(h + b)},
                (h, b), leaves(h, b), grad)


def cross_entropy_cases(N, V, dev, dt):
    logits = 3 * torch.randn(N, V, device=dev, dtype=dt)
    targets = torch.randint(V, (N,), device=dev)
    size = logits.numel() * logits.element_size()
    for s in (0.0, 0.1):
        yield Case("cross_entropy", f"N={N} V={V}, label smoothing {s}", "GB/s",
                   (size, 3 * size), lambda x, t, s=s: ops.cross_entropy(x, t, label_smoothing=s),
                   {"F.cross_entropy": lambda x, t, s=s: F.cross_entropy(x, t, label_smoothing=s)},
                   (logits, targets), leaves(logits, targets), memory=True)


def rotary_case(B, H, T, D, dev, dt):
    """Queries as the attention module hands them over: the (B, H, T, D) view of a projection."""
    x = torch.randn(B, T, H * D, device=dev, dtype=dt)
    grad = torch.randn(B, H, T, D, device=dev, dtype=dt)
    cos, sin = (t.to(dev, dt) for t in rotary_tables(100 + T, D))
    positions = torch.arange(100, 100 + T, device=dev)
    heads = lambda x: x.view(B, T, H, D).transpose(1, 2)  # noqa: E731
    size = x.numel() * x.element_size()
    return Case("rotary", f"B={B} H={H} T={T} D={D}, heads view", "GB/s", (2 * size, 4 * size),
                lambda x: ops.rotary(heads(x), cos, sin, positions),
                {"plain PyTorch": lambda x: torch_rotary(heads(x), cos, sin, positions)},
                (x,), leaves(x), grad)


def linear_cross_entropy_case(N, C, V, dev, dt):
    x, w = torch.randn(N, C, device=dev, dtype=dt), torch.randn(V, C, device=dev, dtype=dt)
    w = w / C ** 0.5
    t = torch.randint(V, (N,), device=dev)
    t[::10] = -100
    flops = 2 * N * C * V
    return Case("linear_cross_entropy", f"N={N} C={C} V={V}", "TFLOP/s", (flops, 3 * flops),
                ops.linear_cross_entropy,
                {"F.linear + F.cross_entropy": lambda x, w, t: F.cross_entropy(F.linear(x, w), t)},
                (x, w, t), leaves(x, w, t), memory=True)


def cases(sizes, dev, dt):
    """Every op's cases in dt; float16 (the tensor-core attention's second type) attention's
    alone. The 16-bit types add attention at head dim 128."""
    yield from attention_cases(sizes["attention"], dev, dt)
    if dt != torch.float32:
        yield from attention_cases(sizes["attention_16bit"], dev, dt, padded=False)
    if dt == torch.float16:
        return
    yield decode_case(*sizes["decode"], dev, dt)
    yield from norm_cases(*sizes["norm"], dev, dt)
    yield bias_gelu_case(*sizes["gelu"], dev, dt)
    yield from cross_entropy_cases(*sizes["logits"], dev, dt)
    yield rotary_case(*sizes["rotary"], dev, dt)
    yield linear_cross_entropy_case(*sizes["head"], dev, dt)


# ---------------------------------------------------------------------------------------------
# Measurement


def timed(fn, dev: str) -> float:
    """Seconds of one call: CUDA events around it on the GPU, the host clock on the CPU."""
    if dev == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def medians(calls, reset, dev, settings) -> list:
    """The median seconds of each call, after `warmup` calls of each; the calls alternate, one
    of each per round, for at least `reps` rounds and more (up to `max_reps`) while under
    `budget_s`, so that drift in the machine's state hits all alike."""
    for _ in range(settings["warmup"]):
        for call in calls:
            reset()
            call()
    times = [[] for _ in calls]
    start = time.perf_counter()
    while True:
        for call, ts in zip(calls, times):
            reset()
            ts.append(timed(call, dev))
        rounds = len(times[0])
        if rounds >= settings["max_reps"] or (rounds >= settings["reps"] and
                                              time.perf_counter() - start > settings["budget_s"]):
            break
    reset()
    return [statistics.median(ts) for ts in times]


def pass_call(fn, case: Case, backward: bool):
    """A zero-argument call of fn for the pass: the forward without gradients, or the forward
    and its backward."""
    if not backward:
        def forward():
            with torch.no_grad():
                fn(*case.args)
        return forward

    def forward_backward():
        out = fn(*case.grad_args)
        outs = out if isinstance(out, tuple) else (out,)
        grads = None if case.grad_out is None else (
            case.grad_out if isinstance(case.grad_out, tuple) else (case.grad_out,))
        torch.autograd.backward(outs, grads)
    return forward_backward


def rel_err(case: Case, baseline) -> float:
    with torch.no_grad():
        ours = case.compared(case.ours(*case.args)).double()
        base = case.compared(baseline(*case.args)).double()
    return ((ours - base).norm() / base.norm()).item()


def refusal(call):
    """None if call() runs, else the first line of why not (an SDPA backend refusing a case)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
        return None
    except RuntimeError as e:
        return (str(e).strip().splitlines() or ["RuntimeError"])[0][:60]


def measure(case: Case, dt, dev, settings) -> list:
    """The rows of one case: one per pass and baseline."""
    rows = []

    def reset():
        for t in case.grad_args or ():
            t.grad = None
    errs = {name: None for name in case.baselines}
    for backward in (False, True):
        if case.work[backward] is None:
            continue
        ours = pass_call(case.ours, case, backward)
        base = {name: pass_call(fn, case, backward) for name, fn in case.baselines.items()}
        refused = {name: refusal(call) for name, call in base.items()}
        running = [name for name in base if refused[name] is None]
        for name in running:
            if errs[name] is None:
                errs[name] = rel_err(case, case.baselines[name])
        with torch.set_grad_enabled(backward):
            times = medians([ours] + [base[name] for name in running], reset, dev, settings)
            peaks = ({name: cuda_peak_bytes(call, reset) for name, call in
                      [("ours", ours)] + [(n, base[n]) for n in running]}
                     if case.memory and dev == "cuda" else {})
        timed_base = dict(zip(running, times[1:]))
        for name in base:
            rows.append(dict(op=case.op, shape=case.shape, dtype=DTYPE_NAMES[dt],
                             passes="fwd+bwd" if backward else "fwd", baseline=name,
                             unit=case.unit, work=case.work[backward], ours=times[0],
                             base=timed_base.get(name), refused=refused[name], err=errs[name],
                             tol=TOLERANCE[dt], peak_ours=peaks.get("ours"),
                             peak_base=peaks.get(name)))
    return rows


def ceilings(dev: str, dry: bool, settings) -> str:
    """The chip's copy bandwidth and bfloat16 matrix rate, measured as METHOD notes say."""
    x = torch.randn(2**20 if dry else 2**28, device=dev)  # 1 GiB on the GPU
    y = torch.empty_like(x)
    copy, = medians([lambda: y.copy_(x)], lambda: None, dev, settings)
    m = 256 if dry else 8192
    a, b = (torch.randn(m, m, device=dev, dtype=torch.bfloat16) for _ in range(2))
    matmul, = medians([lambda: a @ b], lambda: None, dev, settings)
    return (f"Ceilings: device-to-device copy {2 * x.nbytes / copy / 1e9:,.4g} GB/s (bytes read "
            f"+ written, {x.nbytes / 2**20:,.0f} MiB); bf16 {m}x{m}x{m} matrix product "
            f"{2 * m**3 / matmul / 1e12:,.4g} TFLOP/s (random data).")


# ---------------------------------------------------------------------------------------------
# Output


def rate(row, seconds) -> str:
    scale = 1e12 if row["unit"] == "TFLOP/s" else 1e9
    return f"{row['work'] / seconds / scale:,.4g} {row['unit']}"


def cells(row) -> list:
    ms = f"{row['ours'] * 1e3:.3f}"
    if row["base"] is None:
        return [row["op"], row["shape"], row["dtype"], row["passes"], row["baseline"], ms,
                f"n/a: {row['refused']}", "", rate(row, row["ours"]), "", "", ""]
    err = f"{row['err']:.1e}" + (" DIFFERS" if row["err"] > row["tol"] else "")
    peak = ("" if row["peak_ours"] is None else
            f"{row['peak_ours'] / 2**20:,.0f} / {row['peak_base'] / 2**20:,.0f}")
    return [row["op"], row["shape"], row["dtype"], row["passes"], row["baseline"], ms,
            f"{row['base'] * 1e3:.3f}", f"{row['ours'] / row['base']:.2f}",
            rate(row, row["ours"]), rate(row, row["base"]), err, peak]


def aims(rows: list) -> list:
    """One line per aim: met or missed, and the worst ratio among the rows it holds for."""
    lines = []
    for what, holds, kind, limit in AIMS:
        ratios = [r["ours"] / r["base"] if kind == "time" else r["peak_ours"] / r["peak_base"]
                  for r in rows if holds(r) and r["base"] is not None
                  and (kind == "time" or r["peak_ours"] is not None)]
        verdict = ("not measured" if not ratios else
                   f"{'met' if max(ratios) <= limit else 'MISSED'} (worst ours/baseline "
                   f"{max(ratios):.2f} over {len(ratios)} rows)")
        lines.append(f"- {what}: {verdict}")
    return lines


def write_table(path: Path, header: list, rows: list, footer: list = ()) -> None:
    lines = header + ["", "| " + " | ".join(COLUMNS) + " |",
                      "|" + "|".join("---" if i < 5 else "--:" for i in range(len(COLUMNS))) + "|"]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    lines += ["", "Aims:", *footer] if footer else []
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", type=Path, required=True, help="markdown table to (re)write")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU, float32, and float16's attention cases (which "
                        "the CPU computes in float32)")
    args = p.parse_args()
    dev = "cpu" if args.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        p.error(f"torch {torch.__version__} sees no CUDA device (--dry-run runs on the CPU)")
    settings = (dict(warmup=1, reps=2, max_reps=2, budget_s=0.0) if args.dry_run else
                dict(warmup=3, reps=5, max_reps=100, budget_s=0.3))
    dtypes = ([torch.float32, torch.float16] if args.dry_run else
              [torch.float32, torch.bfloat16, torch.float16])
    if args.dry_run:
        torch.set_num_threads(1)  # a shared CPU: more threads only add noise
    torch.manual_seed(0)
    device = torch.cuda.get_device_name() if dev == "cuda" else "CPU (dry run: tiny shapes)"
    header = [f"{device}, torch {torch.__version__}.", ceilings(dev, args.dry_run, settings)]
    print("\n".join(header), flush=True)
    rows, failed = [], []
    for dt in dtypes:
        for case in cases(SIZES["dry" if args.dry_run else "gpu"], dev, dt):
            try:
                new = measure(case, dt, dev, settings)
            except Exception:  # noqa: BLE001  one case's failure must not cost the others
                failed.append(f"{case.op} {case.shape} {DTYPE_NAMES[dt]}")
                print(f"FAILED: {failed[-1]}\n{traceback.format_exc()}", flush=True)
                continue
            for row in new:
                print(" | ".join(cells(row)), flush=True)
            rows += new
            write_table(args.table, header, rows)
            del case
            if dev == "cuda":
                torch.cuda.empty_cache()
    missing = sorted({op.name for op in OPS} - {r["op"] for r in rows})
    differs = sorted({f"{r['op']} {r['shape']} {r['dtype']} vs {r['baseline']}" for r in rows
                      if r["err"] is not None and r["err"] > r["tol"]})
    notes = ([f"Failed (see the log): {'; '.join(failed)}."] if failed else []) + \
        ([f"Not benchmarked: {', '.join(missing)}."] if missing else []) + \
        ([f"Ours differs from the baseline: {'; '.join(differs)}."] if differs else [])
    write_table(args.table, header + notes, rows, aims(rows))
    print("\n".join(notes + aims(rows)))
    raise SystemExit(1 if notes else 0)


if __name__ == "__main__":
    main()
