#!/usr/bin/env python
"""Where a training step's time goes: the GPT's optimizer step, exactly as pygpt.train runs it
(benchmarks/timed_trainer.py: forward with the loss, backward, gradient clipping, AdamW,
zero_grad), under torch.profiler, on our kernels (`ext`) and on plain PyTorch ops (`torch`),
broken down by kind of work, in ms per step and % of the step.

Every row but the last three is the self time (the time inside an op minus the ops it calls)
of the ops of one kind of work in a step: our attention and ATen's SDPA, the matmuls (addmm, mm,
bmm), layer norm, cross-entropy, GELU and dropout, each forward and backward (backward: run by
the autograd engine); the ops of the gradient-norm clipping and of the optimizer step; and every
other op (elementwise, copies, the embedding). An op inside one of a known kind (a transpose
inside a linear layer, a bias gradient's sum inside AddmmBackward0) counts to that kind (on CPU
dropout's backward is a plain multiplication by the mask: other). With pygpt.ops' Python
autograd glue, our ops' forward rows include the glue (the kernel runs inside it with no
profiler event of its own). "Python, autograd, dispatch" is the rest of the step:
its wall time minus its ops' self times, i.e. the Python of the modules, the autograd engine's
bookkeeping and the dispatcher, and the profiler's own cost (compare the unprofiled step time
printed below the table).

Timing: `--warmup` untimed steps per kernel set, then `--steps` unprofiled and `--steps`
profiled steps each, the kernel sets alternating in blocks of `--block` steps, so that a change
in the machine's load hits both alike. Every figure is a mean over the faster half of the steps,
so that steps slowed by other work on the machine do not count; times are wall-clock, so a busy
machine still inflates them.

Usage:
  python benchmarks/profile_train.py --threads 1                 # baby
  python benchmarks/profile_train.py --preset shakespeare --batch-size 8 --steps 6 --warmup 2 \
      --block 2 --threads 1
  python benchmarks/profile_train.py --threads 1 --markdown --top 8
"""
from __future__ import annotations

import contextlib
import statistics
from collections import defaultdict
from typing import Iterator, Optional

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function

from machine import busy_warning, cpu_model
from timed_trainer import Trainer, describe_run, interleaved_steps, parse, parser, \
    shakespeare_steps
from pygpt.config import KERNEL_SETS

CLIP = "pygpt.profile: gradient clipping"  # the label the clipping runs under
GLUE = "GeneratedBackwardFor_pygpt_"
STEP = "pygpt.profile: step of "  # the label each profiled step runs under
OTHER = "elementwise, copies, views, other"
REST = "Python, autograd, dispatch (rest)"
ROWS = ["our attention fwd", "our attention bwd", "ATen SDPA fwd", "ATen SDPA bwd", "matmuls fwd",
        "matmuls bwd", "layer norm fwd", "layer norm bwd", "cross-entropy fwd",
        "cross-entropy bwd", "GELU fwd", "GELU bwd", "dropout fwd", "dropout bwd",
        "gradient norm + clipping", "optimizer step (AdamW)", OTHER]
KINDS = {  # op name, or (in backward) autograd node name, -> kind of work
    **dict.fromkeys(["aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                     "aten::linear", "AddmmBackward", "MmBackward", "BmmBackward"], "matmuls"),
    # Our fused ops count to the work they fuse: add_layer_norm (residual add + layer norm) to
    # layer norm, bias_gelu (bias add + GELU; plain PyTorch adds that bias in its addmm) to GELU.
    **dict.fromkeys(["pygpt::layer_norm", "pygpt::layer_norm_backward", "pygpt::add_layer_norm",
                     "pygpt::add_layer_norm_backward", "aten::layer_norm",
                     "aten::native_layer_norm", "aten::native_layer_norm_backward"], "layer norm"),
    **dict.fromkeys(["pygpt::cross_entropy", "pygpt::cross_entropy_backward",
                     "aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax",
                     "aten::_log_softmax_backward_data", "aten::nll_loss", "aten::nll_loss_nd",
                     "aten::nll_loss_forward", "aten::nll_loss_backward"], "cross-entropy"),
    **dict.fromkeys(["pygpt::bias_gelu", "pygpt::bias_gelu_backward", "aten::gelu",
                     "aten::gelu_backward", "GeluBackward"], "GELU"),
    **dict.fromkeys(["aten::dropout", "aten::native_dropout", "aten::native_dropout_backward",
                     "NativeDropoutBackward"], "dropout"),
}


def kind_of(scope: str) -> Optional[str]:
    """The kind of work of an op or autograd node (`autograd::engine::evaluate_function: X`)."""
    if scope.startswith("pygpt::attention"):
        return "our attention"
    if "scaled_dot_product" in scope or "ScaledDotProduct" in scope:
        return "ATen SDPA"
    node = scope.rsplit(": ", 1)[-1].rstrip("0123456789")  # AddmmBackward0 -> AddmmBackward
    return KINDS.get(node)


def op_name(event: FunctionEvent) -> Optional[str]:
    """The op event stands for, or None for a Python scope, an autograd node or a label. Our
    ops' autograd glue (pygpt.ops' register_autograd) runs the forward kernel inside an autograd
    Function, recorded as `GeneratedBackwardFor_pygpt_<op>_default` with no event of the kernel's
    own: that event is the op's forward (kernel and glue)."""
    name = event.name
    if name.startswith(GLUE) and name.endswith("_default"):
        return "pygpt::" + name[len(GLUE):-len("_default")]
    return name if name.startswith(("aten::", "pygpt::")) else None


def ancestors(event: FunctionEvent) -> Iterator[str]:
    parent = event.cpu_parent
    while parent is not None:
        yield parent.name
        parent = parent.cpu_parent


def row_of(name: str, above: list[str]) -> str:
    """The table row that the self time of an event of op `name` counts to (above: the names of
    the scopes it ran in, innermost first): the optimizer step, the clipping, else the kind of
    work and the phase."""
    if any(scope.startswith(("Optimizer.step", "Optimizer.zero_grad")) for scope in above):
        return "optimizer step (AdamW)"
    if CLIP in above:
        return "gradient norm + clipping"
    phase = ("bwd" if "backward" in name or any(
        scope.startswith("autograd::engine::evaluate_function") for scope in above) else "fwd")
    # The outermost op or autograd node of a known kind: the transposes inside a linear layer,
    # the bias gradient's sum inside AddmmBackward0 and the mask inside dropout count to them.
    kind = next(filter(None, map(kind_of, [*reversed(above), name])), None)
    return f"{kind} {phase}" if kind else OTHER


@contextlib.contextmanager
def labelled_clipping() -> Iterator[None]:
    """Runs torch.nn.utils.clip_grad_norm_ (which train_step looks up when it calls it) under a
    profiler label, so that its ops get their own row."""
    clip = torch.nn.utils.clip_grad_norm_

    def labelled(*args, **kwargs):
        with record_function(CLIP):
            return clip(*args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = labelled
    try:
        yield
    finally:
        torch.nn.utils.clip_grad_norm_ = clip


def faster_half(times: list[float]) -> list[int]:
    """The indices of the faster half of the steps (at least one)."""
    return sorted(range(len(times)), key=lambda i: times[i])[:max(1, len(times) // 2)]


def profile_steps(trainers: dict[str, Trainer], step_batches, block: int, top: int) -> dict:
    """Profiles one step of every trainer per batch, the trainers alternating in blocks of
    `block` steps. Per trainer, means over the faster half of its steps (so that steps slowed by
    other work on the machine do not count) of each row's op self time, the rest and the step
    (ms), and the `top` largest ops of the "other" row (mean ms over all steps)."""
    n = len(step_batches)
    walls = {k: [] for k in trainers}
    with labelled_clipping(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for start in range(0, n, block):
            for k, trainer in trainers.items():
                for i in range(start, min(start + block, n)):
                    with record_function(f"{STEP}{k} {i}"):
                        walls[k].append(trainer.step(step_batches[i])[0])
    per_step = {k: [defaultdict(float) for _ in range(n)] for k in trainers}
    others = {k: defaultdict(float) for k in trainers}
    for event in prof.events():
        name = op_name(event)
        if name is None:
            continue
        above = list(ancestors(event))
        k, i = next(scope for scope in above if scope.startswith(STEP))[len(STEP):].split()
        row = row_of(name, above)
        per_step[k][int(i)][row] += event.self_cpu_time_total / 1e3
        if row == OTHER:
            others[k][name] += event.self_cpu_time_total / 1e3 / n
    result = {}
    for k in trainers:
        fastest = faster_half(walls[k])
        rows = {row: statistics.fmean(per_step[k][i][row] for i in fastest) for row in ROWS}
        step_ms = statistics.fmean(walls[k][i] for i in fastest) * 1e3
        rows[REST] = step_ms - sum(rows.values())
        result[k] = {"rows": rows, "step_ms": step_ms,
                     "other_ops": sorted(others[k].items(), key=lambda item: -item[1])[:top]}
    return result


def breakdown(model_cfg, train_cfg, threads: int, steps: int, warmup: int, block: int,
              top: int) -> dict:
    """Each kernel set's profile, and its unprofiled step time (ms, the faster half's mean)."""
    torch.set_num_threads(threads)
    model_cfg, step_batches, init_state = shakespeare_steps(model_cfg, train_cfg,
                                                            warmup + 2 * steps)
    trainers = {k: Trainer(model_cfg, train_cfg, k, init_state) for k in KERNEL_SETS}
    for i in range(warmup):
        for trainer in trainers.values():
            trainer.step(step_batches[i])
    times, _ = interleaved_steps(trainers, step_batches, warmup, steps, block)
    result = profile_steps(trainers, step_batches[warmup + steps:], block, top)
    for k in trainers:
        result[k]["unprofiled_ms"] = statistics.fmean(times[k][i] for i in
                                                      faster_half(times[k])) * 1e3
    return result


def table(result: dict, markdown: bool) -> list[str]:
    """The rows (those with time on some kernel set), the ops' total, the rest, the step."""
    sides = list(result)
    lines = []

    def line(label: str, values: list[float]) -> None:
        cells = [c for k, v in zip(sides, values)
                 for c in (f"{v:.2f}", f"{100 * v / result[k]['step_ms']:.1f}%")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |" if markdown
                     else f"{label:<34}" + "".join(f"{c:>14}" for c in cells))

    head = [c for k in sides for c in (f"{k} ms/step", f"{k} %")]
    if markdown:
        lines += ["| | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    else:
        lines.append(f"{'':<34}" + "".join(f"{c:>14}" for c in head))
    for row in ROWS:
        values = [result[k]["rows"][row] for k in sides]
        if any(v >= 0.005 for v in values):
            line(row, values)
    line("all ops", [sum(result[k]["rows"][row] for row in ROWS) for k in sides])
    line(REST, [result[k]["rows"][REST] for k in sides])
    line("step (profiled)", [result[k]["step_ms"] for k in sides])
    return lines


def main(argv=None):
    p = parser(__doc__, "kernel set", threads=[1], steps=20, warmup=5,
               warmup_help="untimed steps per kernel set first")
    p.add_argument("--top", type=int, default=0,
                   help="also list the largest ops of the 'other' row, this many per kernel set")
    args, model_cfg, train_cfg = parse(p, argv)
    describe_run(args.preset, model_cfg, train_cfg,
                 f"{args.steps} unprofiled then {args.steps} profiled steps each after "
                 f"{args.warmup} warmup")
    print(f"# CPU: {cpu_model()}")
    busy_warning(args.threads)
    for threads in args.threads:
        result = breakdown(model_cfg, train_cfg, threads, args.steps, args.warmup, args.block,
                           args.top)
        print(f"\n# {threads} thread(s)")
        print("\n".join(table(result, args.markdown)))
        for k, r in result.items():
            print(f"# {k}: step {r['unprofiled_ms']:.2f} ms unprofiled: the profiler adds "
                  f"{r['step_ms'] - r['unprofiled_ms']:+.2f} ms, most of it to the rest")
            if r["other_ops"]:
                print(f"# {k}, largest 'other' ops (ms/step): " + ", ".join(
                    f"{name} {ms:.2f}" for name, ms in r["other_ops"]))


if __name__ == "__main__":
    main()
