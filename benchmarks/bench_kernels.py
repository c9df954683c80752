#!/usr/bin/env python
"""Benchmark pygpt's kernels against the ATen ops they replace, in one process.

For every op and shape, and for each requested intra-op thread count (CPU) or on the GPU
(--device cuda, float32 or --dtype bfloat16), prints the median time of ours (called through the
public pygpt.ops functions) and of ATen (on the GPU, SDPA picks its flash kernel where it can),
and the ratio ours/ATen (< 1 means ours is faster), for the forward alone and for forward +
backward. On the GPU, attention also runs at B=8 H=12 T=1024 D=64. cross_entropy runs each
shape without label smoothing and with label_smoothing=0.1 (ATen: F.cross_entropy with the same).
rotary has no ATen op: its baseline ("ATen" below) is the same math in plain PyTorch ops
(pygpt.ops.rotary.torch_rotary), on the strided queries the attention module produces; the last
shape is a one-token decode step, where the per-call overhead is all there is.

Timing: `--warmup` untimed calls, then the median over `--repeat` calls of time.perf_counter()
around each single call (on the GPU, with torch.cuda.synchronize() before and after); calls of
ours and ATen alternate, so load drift hits both alike. Forward-only calls use inputs that do not
require grad (inference). A
forward+backward call is the forward plus .backward() on the output with a gradient precomputed
outside the timed region (attention, layer_norm) or on the scalar loss (cross_entropy); .grad is
reset to None outside the timed region.

Memory (cross_entropy only): peak extra bytes allocated during one call; on the GPU from
torch.cuda.max_memory_allocated, on the CPU two ways:
  * alloc: torch.profiler(profile_memory=True) in this process; the '[memory]' events carry the
    CPU allocator's running 'Total Allocated' since profiling began, and we report its maximum.
    It counts every tensor allocation (outputs, saved tensors, temporaries, the logits gradient)
    but not malloc/new scratch memory inside a kernel.
  * rss (with --rss): a fresh subprocess builds the inputs, resets the peak-RSS mark
    (/proc/self/clear_refs), runs one call, and reports VmHWM - VmRSS(before). This counts
    everything the process touched, kernel scratch included, at page granularity.

Usage:
  python benchmarks/bench_kernels.py                    # all ops, 1 and 2 threads
  python benchmarks/bench_kernels.py --threads 1 --op attention --repeat 20
  python benchmarks/bench_kernels.py --threads 1 --op attention_bias   # position-bias cost
  python benchmarks/bench_kernels.py --markdown         # README-ready table
  python benchmarks/bench_kernels.py --device cuda --dtype bfloat16
  python benchmarks/bench_kernels.py --isa avx2 --threads 1   # AVX2 against AVX2, on any CPU

--isa runs our kernels with that ISA's build (pygpt.cpu_isa) and ATen and MKL with the same ISA
(the process restarts itself with ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS set), so an
AVX-512 machine measures what an AVX2-only one would see.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from machine import cpu_model, isa_note, use_isa


def _ours():
    import pygpt.ops

    return pygpt.ops


# ---------------------------------------------------------------------------------------------
# Cases. Each returns dict(name, shape, fwd=(ours, aten), fwdbwd=(ours, aten), ...) where each
# entry is a pair of zero-argument callables plus a `reset` that clears gradients.


DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def attention_case(B, H, T, D, device, dtype):
    q, k, v = (torch.randn(B, H, T, D, dtype=dtype, device=device) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(B, H, T, D, dtype=dtype, device=device)
    ops = _ours()

    def reset():
        for t in (qg, kg, vg):
            t.grad = None

    return dict(
        op="attention", shape=f"B={B} H={H} T={T} D={D}, causal, {DTYPE_NAMES[dtype]}",
        fwd=(lambda: ops.attention(q, k, v, causal=True),
             lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        fwdbwd=(lambda: ops.attention(qg, kg, vg, causal=True).backward(grad),
                lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(grad)),
        reset=reset,
        check=lambda: (ops.attention(q, k, v, causal=True),
                       F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    )


def padded_lengths(B, T, device, low=8):
    """Per-row lengths uniform in [low, T], the same every run."""
    return torch.randint(low, T + 1, (B,), generator=torch.Generator().manual_seed(0)).to(device)


def padded_attention_case(B, H, T, D, causal, baseline, device, dtype):
    """Ours on a right-padded batch (lengths uniform in 8..T) against `baseline`: "sdpa", SDPA
    with the equivalent boolean mask, or "full", ours on the same batch without lengths (what
    padding costs when the kernel does not skip it)."""
    q, k, v = (torch.randn(B, H, T, D, dtype=dtype, device=device) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(B, H, T, D, dtype=dtype, device=device)
    lengths = padded_lengths(B, T, device)
    i = torch.arange(T, device=device)
    real = i[None, :] < lengths[:, None]  # (B, T)
    mask = (real[:, :, None] & real[:, None, :])[:, None]  # (B, 1, T, T)
    if causal:
        mask = mask & (i[None, :] <= i[:, None])
    ops = _ours()

    def padded(q, k, v):
        return ops.attention(q, k, v, causal=causal, q_lengths=lengths, kv_lengths=lengths)

    other = ((lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
             if baseline == "sdpa" else (lambda q, k, v: ops.attention(q, k, v, causal=causal)))

    def reset():
        for t in (qg, kg, vg):
            t.grad = None

    real_share = lengths.sum().item() / (B * T)
    return dict(
        op="attention", shape=(f"B={B} H={H} T={T} D={D} padded ({real_share:.0%} real), "
                               f"{'causal' if causal else 'full'}, {DTYPE_NAMES[dtype]}, "
                               f"vs {'SDPA + mask' if baseline == 'sdpa' else 'ours unpadded'}"),
        fwd=(lambda: padded(q, k, v), lambda: other(q, k, v)),
        fwdbwd=(lambda: padded(qg, kg, vg).backward(grad), lambda: other(qg, kg, vg).backward(grad)),
        reset=reset,
        # The padded rows of an unpadded call hold other values; compare where both are defined.
        check=lambda: (padded(q, k, v) * real[:, None, :, None],
                       other(q, k, v) * real[:, None, :, None]) if baseline == "sdpa" else
        (padded(q, k, v)[0:1, :, :1], other(q, k, v)[0:1, :, :1]),
    )


def layer_norm_case(N, C, device, dtype):
    x, w, b = (torch.randn(*shape, dtype=dtype, device=device) for shape in ((N, C), (C,), (C,)))
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    grad = torch.randn(N, C, dtype=dtype, device=device)
    ops = _ours()

    def reset():
        for t in (xg, wg, bg):
            t.grad = None

    return dict(
        op="layer_norm", shape=f"({N}, {C}), weight+bias, {DTYPE_NAMES[dtype]}",
        fwd=(lambda: ops.layer_norm(x, w, b), lambda: F.layer_norm(x, (C,), w, b)),
        fwdbwd=(lambda: ops.layer_norm(xg, wg, bg).backward(grad),
                lambda: F.layer_norm(xg, (C,), wg, bg).backward(grad)),
        reset=reset,
        check=lambda: (ops.layer_norm(x, w, b), F.layer_norm(x, (C,), w, b)),
    )


def cross_entropy_inputs(N, V, device="cpu", dtype=torch.float32):
    logits = torch.randn(N, V, dtype=dtype, device=device)
    targets = torch.randint(0, V, (N,), device=device)
    return logits, targets


def cross_entropy_fns(smoothing):
    """(ours, ATen): cross-entropy of (logits, targets) with this label smoothing."""
    ops = _ours()
    return (lambda x, t: ops.cross_entropy(x, t, label_smoothing=smoothing),
            lambda x, t: F.cross_entropy(x, t, label_smoothing=smoothing))


def cross_entropy_case(N, V, smoothing, device, dtype):
    logits, targets = cross_entropy_inputs(N, V, device, dtype)
    lg = logits.clone().requires_grad_()
    ours, aten = cross_entropy_fns(smoothing)

    def reset():
        lg.grad = None

    smoothed = f", smoothing {smoothing}" if smoothing else ""
    return dict(
        op="cross_entropy", shape=f"N={N} V={V}{smoothed}, {DTYPE_NAMES[dtype]}",
        fwd=(lambda: ours(logits, targets), lambda: aten(logits, targets)),
        fwdbwd=(lambda: ours(lg, targets).backward(), lambda: aten(lg, targets).backward()),
        reset=reset,
        check=lambda: (ours(logits, targets), aten(logits, targets)),
        memory=(N, V, smoothing),
    )


def rotary_case(B, H, T, D, rotary_dim, device, dtype):
    """Queries as the attention module hands them over (the strided (B, H, T, D) view of a
    (B, T, H * D) projection) at positions after a cache of 100, against the same math in plain
    PyTorch (pygpt.ops.rotary.torch_rotary: gather, slice, multiply, concatenate)."""
    from pygpt.ops.rotary import torch_rotary
    from pygpt.nn.rotary import rotary_tables

    def heads(t):
        return t.view(B, T, H, D).transpose(1, 2)

    x = torch.randn(B, T, H * D, dtype=dtype, device=device)
    xg = x.clone().requires_grad_()
    cos, sin = (t.to(device, dtype) for t in rotary_tables(100 + T, rotary_dim))
    positions = torch.arange(100, 100 + T, device=device)
    grad = torch.randn(B, H, T, D, dtype=dtype, device=device)
    ops = _ours()

    def reset():
        xg.grad = None

    return dict(
        op="rotary", shape=f"B={B} H={H} T={T} D={D} rotary_dim={rotary_dim}, heads view, "
                           f"{DTYPE_NAMES[dtype]}, vs plain-PyTorch math",
        fwd=(lambda: ops.rotary(heads(x), cos, sin, positions),
             lambda: torch_rotary(heads(x), cos, sin, positions)),
        fwdbwd=(lambda: ops.rotary(heads(xg), cos, sin, positions).backward(grad),
                lambda: torch_rotary(heads(xg), cos, sin, positions).backward(grad)),
        reset=reset,
        check=lambda: (ops.rotary(heads(x), cos, sin, positions),
                       torch_rotary(heads(x), cos, sin, positions)),
    )


def biased_attention_case(B, H, T, D, kind, device, dtype):
    """Ours with a position bias computed in the kernel ("relative": a (H, 65) table; "alibi":
    per-head slopes) against ours without: the cost of the bias. The bias is all zeros, so that
    both compute the same output (its values do not change the work)."""
    q, k, v = (torch.randn(B, H, T, D, dtype=dtype, device=device) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(B, H, T, D, dtype=dtype, device=device)
    zeros = torch.zeros(H, 65, dtype=dtype, device=device)
    bias = (dict(rel_bias=zeros.requires_grad_()) if kind == "relative"
            else dict(alibi_slopes=zeros[:, 0].contiguous()))
    ops = _ours()

    def reset():
        for t in (qg, kg, vg, *bias.values()):
            t.grad = None

    return dict(
        op="attention", shape=f"B={B} H={H} T={T} D={D}, causal, {DTYPE_NAMES[dtype]}, "
                              f"{kind} bias vs none",
        fwd=(lambda: ops.attention(q, k, v, causal=True, **bias),
             lambda: ops.attention(q, k, v, causal=True)),
        fwdbwd=(lambda: ops.attention(qg, kg, vg, causal=True, **bias).backward(grad),
                lambda: ops.attention(qg, kg, vg, causal=True).backward(grad)),
        reset=reset,
        check=lambda: (ops.attention(q, k, v, causal=True, **bias),
                       ops.attention(q, k, v, causal=True)),
    )


CASES = {
    "attention": [(attention_case, s) for s in
                  [(12, 4, 64, 32), (12, 4, 256, 32), (8, 6, 256, 64), (1, 8, 2048, 64)]],
    "attention_padded": [(padded_attention_case, (32, 4, 128, 32, causal, baseline))
                         for causal in (False, True) for baseline in ("full", "sdpa")],
    "attention_bias": [(biased_attention_case, (*s, kind)) for kind in ("relative", "alibi")
                       for s in [(12, 4, 256, 32), (1, 8, 2048, 64)]],
    "layer_norm": [(layer_norm_case, s) for s in [(768, 128), (16384, 384)]],
    "cross_entropy": [(cross_entropy_case, (N, V, smoothing)) for smoothing in (0.0, 0.1)
                      for N, V in [(3072, 65), (2048, 50257)]],
    "rotary": [(rotary_case, s) for s in [(12, 4, 64, 32, 32), (8, 6, 256, 64, 64),
                                          (8, 6, 256, 64, 32), (1, 6, 1, 64, 64)]],
}
CUDA_EXTRA_CASES = {"attention": [(attention_case, (8, 12, 1024, 64))]}


# ---------------------------------------------------------------------------------------------
# Measurement


def time_pair(fn_a, fn_b, reset, warmup, repeat, budget_s, sync=lambda: None):
    """Median seconds of fn_a() and of fn_b(), timing one call at a time and alternating a, b, a,
    b, ... so that drift in machine load affects both alike. repeat=None: at least 5 calls each,
    more while the total stays under budget_s, at most 200. sync() waits for queued device work."""
    for _ in range(warmup):
        for fn in (fn_a, fn_b):
            reset()
            fn()
    times = ([], [])
    start = time.perf_counter()
    while True:
        for fn, ts in zip((fn_a, fn_b), times):
            reset()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        n = len(times[0])
        if repeat is not None:
            if n >= repeat:
                break
        elif n >= 200 or (n >= 5 and time.perf_counter() - start > budget_s):
            break
    reset()
    return statistics.median(times[0]), statistics.median(times[1]), n


def alloc_peak_bytes(fn, reset):
    """Peak of the CPU allocator's 'Total Allocated' during fn(), from torch.profiler memory
    events (counts tensor allocations only)."""
    from torch.profiler import ProfilerActivity, profile

    reset()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    reset()
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not mem:
        return 0
    first = mem[0]["args"]
    base = first["Total Allocated"] - first["Bytes"]
    return max(0, max(e["args"]["Total Allocated"] for e in mem) - base)


def cuda_peak_bytes(fn, reset):
    """Peak bytes the CUDA caching allocator handed out during fn(), above what was live before."""
    reset()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    reset()
    return peak


def _status_kib():
    s = open("/proc/self/status").read()
    return {k: int(re.search(k + r":\s+(\d+)", s).group(1)) for k in ("VmRSS", "VmHWM")}


def rss_child(impl, which, N, V, smoothing, threads):
    """Runs in a fresh subprocess: peak RSS growth (bytes) for one cross_entropy call."""
    torch.set_num_threads(threads)
    fn_for = dict(zip(("ours", "aten"), cross_entropy_fns(smoothing)))[impl]
    # Warm up on a tiny input (thread pool, dispatcher caches) so one-time costs are not counted.
    x0 = torch.randn(4, 8, requires_grad=True)
    fn_for(x0, torch.randint(0, 8, (4,))).backward()
    logits, targets = cross_entropy_inputs(N, V)
    if which == "fwdbwd":
        logits.requires_grad_()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib()["VmRSS"]
    loss = fn_for(logits, targets)
    if which == "fwdbwd":
        loss.backward()
    peak = _status_kib()["VmHWM"]
    print(json.dumps({"bytes": (peak - before) * 1024}))


def rss_peak_bytes(impl, which, N, V, smoothing, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--_rss-child", impl, which, str(N), str(V),
           str(smoothing), str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["bytes"]


# ---------------------------------------------------------------------------------------------
# Output


def fmt_ms(s):
    return f"{s * 1e3:.3f}" if s < 0.1 else f"{s * 1e3:.1f}"


def fmt_mb(b):
    if b is None:
        return "-"
    mb = b / 2**20
    return f"{mb:.1f}" if mb >= 10 else f"{mb:.3g}"


COLUMNS = ["threads", "op", "shape", "pass", "ours ms", "ATen ms", "ours/ATen", "ours MB", "ATen MB"]


def print_rows(rows, markdown, mem_method):
    if markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "|".join("---" if i < 4 else "--:" for i in range(len(COLUMNS))) + "|")
        for r in rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        widths = [max(len(str(x)) for x in [c] + [r[i] for r in rows]) for i, c in enumerate(COLUMNS)]
        line = lambda cells: "  ".join(  # noqa: E731
            str(c).ljust(w) if i < 4 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        print(line(COLUMNS))
        print(line(["-" * w for w in widths]))
        for r in rows:
            print(line(r))
    print()
    print("Times: median of per-call time.perf_counter() after warmup; ratio < 1 means ours is faster.")
    print("fwd: inputs without requires_grad. fwd+bwd: forward + .backward() (precomputed grad / loss).")
    print(f"MB (cross_entropy): peak extra memory of one call, {mem_method}.")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="intra-op thread counts (CPU)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="element type (bfloat16, float16: CUDA only, as the CPU kernels are "
                        "float32/64)")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed calls per measurement (default: >= 5, up to ~1 s or 200 calls)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before timing")
    p.add_argument("--op", nargs="+", choices=list(CASES), default=list(CASES), help="ops to run")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--rss", action="store_true",
                   help="also measure cross_entropy memory as peak RSS growth in fresh subprocesses")
    p.add_argument("--no-check", action="store_true", help="skip the ours-vs-ATen sanity check")
    p.add_argument("--isa", choices=["avx512", "avx2", "base"], default=None,
                   help="our kernels' ISA, and ATen's and MKL's (default: the best for this CPU)")
    p.add_argument("--_rss-child", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device == "cpu":
        use_isa(args.isa)

    if args._rss_child:
        impl, which, N, V, smoothing, threads = args._rss_child
        rss_child(impl, which, int(N), int(V), float(smoothing), int(threads))
        return

    dtype = getattr(torch, args.dtype)
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device")
    if dtype != torch.float32 and not on_gpu:
        p.error("--dtype bfloat16 needs --device cuda (the CPU kernels are float32/float64)")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    tol = 1e-4 if dtype == torch.float32 else 3e-2

    torch.manual_seed(0)
    if on_gpu:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    else:
        backend = [ln for ln in torch.__config__.parallel_info().splitlines() if "backend" in ln]
        print(f"torch {torch.__version__}, {cpu_model()}, {os.cpu_count()} CPUs visible; "
              f"{backend[0].strip() if backend else ''}; {isa_note()}", file=sys.stderr)
    rows = []
    for threads in ([None] if on_gpu else args.threads):
        if threads is not None:
            torch.set_num_threads(threads)
        where = "gpu" if on_gpu else f"{threads} thread{'s' if threads > 1 else ''}"
        for op in args.op:
            for make, shape in CASES[op] + (CUDA_EXTRA_CASES.get(op, []) if on_gpu else []):
                case = make(*shape, args.device, dtype)
                if not args.no_check:
                    with torch.no_grad():
                        a, b = case["check"]()
                    if not torch.allclose(a.float(), b.float(), atol=tol, rtol=tol):
                        err = (a - b).abs().max().item()
                        print(f"WARNING: {op} {case['shape']}: ours differs from ATen "
                              f"(max abs {err:.2e})", file=sys.stderr)
                for pas in ("fwd", "fwdbwd"):
                    ours_fn, aten_fn = case[pas]
                    with torch.set_grad_enabled(pas != "fwd"):
                        t_ours, t_aten, n = time_pair(ours_fn, aten_fn, case["reset"], args.warmup,
                                                      args.repeat, budget_s=2.0, sync=sync)
                    m_ours = m_aten = None
                    if "memory" in case:
                        N, V, smoothing = case["memory"]
                        if on_gpu:
                            with torch.set_grad_enabled(pas != "fwd"):
                                m_ours = cuda_peak_bytes(ours_fn, case["reset"])
                                m_aten = cuda_peak_bytes(aten_fn, case["reset"])
                        elif args.rss:
                            m_ours = rss_peak_bytes("ours", pas, N, V, smoothing, threads)
                            m_aten = rss_peak_bytes("aten", pas, N, V, smoothing, threads)
                        elif pas == "fwd":
                            with torch.no_grad():
                                m_ours = alloc_peak_bytes(ours_fn, case["reset"])
                                m_aten = alloc_peak_bytes(aten_fn, case["reset"])
                        else:
                            m_ours = alloc_peak_bytes(ours_fn, case["reset"])
                            m_aten = alloc_peak_bytes(aten_fn, case["reset"])
                    row = ["gpu" if on_gpu else threads, op, case["shape"],
                           "fwd" if pas == "fwd" else "fwd+bwd",
                           fmt_ms(t_ours), fmt_ms(t_aten), f"{t_ours / t_aten:.2f}",
                           fmt_mb(m_ours), fmt_mb(m_aten)]
                    rows.append(row)
                    print(f"[{where}] {op} {case['shape']} "
                          f"{row[3]}: ours {row[4]} ms, ATen {row[5]} ms, ratio {row[6]}"
                          f" ({n} calls each)" + (f", mem ours {row[7]} MB, ATen {row[8]} MB"
                                                   if m_ours is not None else ""),
                          file=sys.stderr, flush=True)
                del case
    mem_method = ("peak of torch.cuda.max_memory_allocated above the memory live before the call"
                  if on_gpu else
                  "peak RSS growth (VmHWM - VmRSS) in a fresh subprocess; counts all memory"
                  if args.rss else
                  "peak of torch's CPU allocator total from torch.profiler(profile_memory=True) "
                  "memory events; counts tensor allocations (incl. the logits grad), not kernel "
                  "malloc scratch")
    print_rows(rows, args.markdown, mem_method)


if __name__ == "__main__":
    main()
