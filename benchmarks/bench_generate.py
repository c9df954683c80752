#!/usr/bin/env python
"""Generation speed: tokens/s of greedy decoding with the KV cache against re-running the whole
window for every token, and of the same model exported to ONNX and run in onnxruntime (fp32 and
int8), for model shapes of the presets (random weights: speed does not depend on them) or for a
trained checkpoint.

Each case: a batch of `--batch` prompts (default 1; several sizes give one row each and the
ratio of each size's tokens/s to batch 1's) of `--prompt-tokens` tokens (default 1),
`--new-tokens` new tokens per prompt (default 500, so the window slides past the context of both
presets), greedy. tokens/s = batch x new tokens / median wall time of the whole generation over
`--repeat` runs; the generators alternate within every repeat so a load change on a busy machine
hits all alike. Every generator must produce the same tokens as the first (but the int8 model,
whose quantized weights may change a greedy choice); a column says whether they do.

The generators are a registry of named factories: a factory takes the model (in eval mode) and
returns a callable (prompt ids (B, T), n_new) -> ids (B, T + n_new), or None when it cannot run
(e.g. a missing optional dependency; shown as n/a). Preparation (exporting, building a session)
happens in the factory, outside the timing. The onnxruntime generators export the model once
(into a temporary folder, with pygpt.export) and step it with pygpt_runtime.run_onnx, the torch-free
runner, with as many onnxruntime threads as the torch threads of the case.

Usage:
  python benchmarks/bench_generate.py                          # baby and shakespeare, 1 thread
  python benchmarks/bench_generate.py --threads 1 2 --markdown
  python benchmarks/bench_generate.py --ckpt out/ --new-tokens 1000
  python benchmarks/bench_generate.py --preset baby --generators kv-cache --kernels ext torch
  python benchmarks/bench_generate.py --preset baby --generators kv-cache onnx-fp32 --batch 1 16
(The whole-process comparison, python -m pygpt.generate against pygpt-run: see
benchmarks/bench_startup.py.)
"""

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from machine import busy_warning
from pygpt.config import KERNEL_SETS
from pygpt.config.presets import PRESETS, preset
from pygpt.models import GPT
from pygpt.decoding.sampling import Sampling

Runner = Callable[[torch.Tensor, int], torch.Tensor]
GENERATORS: dict[str, Callable[[GPT], Optional[Runner]]] = {}

GREEDY = Sampling(greedy=True)


def generator(name: str):
    """Registers a factory model -> runner (or None if unavailable) under `name`."""

    def register(factory):
        GENERATORS[name] = factory
        return factory

    return register


@generator("kv-cache")
def kv_cache(model: GPT) -> Runner:
    return lambda idx, n: model.generate(idx, n, sampling=GREEDY, use_cache=True)


@generator("no-cache")
def no_cache(model: GPT) -> Runner:
    return lambda idx, n: model.generate(idx, n, sampling=GREEDY, use_cache=False)


APPROXIMATE = {"onnx-int8"}  # quantized: not expected to reproduce the fp32 tokens exactly
_EXPORTS: dict[int, Path] = {}


def _onnx_runner(model: GPT, variant: str) -> Optional[Runner]:
    try:
        from pygpt.storage import checkpoint
        from pygpt.export import export
        from pygpt.tokenizer import CharTokenizer
    except ImportError:
        return None
    if id(model) not in _EXPORTS:
        folder = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
        tokenizer = CharTokenizer([chr(0x100 + i) for i in range(model.config.vocab_size)])
        checkpoint.save(folder / "ckpt", model, tokenizer)
        export(folder / "ckpt", folder / "onnx", quantize="int8")
        _EXPORTS[id(model)] = folder / "onnx"
    from pygpt_runtime import run_onnx as runner
    sessions = {}

    def run(idx: torch.Tensor, n: int) -> torch.Tensor:
        threads = torch.get_num_threads()
        if threads not in sessions:
            sessions[threads] = runner.OnnxGPT(str(_EXPORTS[id(model)]), variant, threads)
        new = list(runner.stream(sessions[threads], idx.numpy(), n, greedy=True))
        return torch.cat([idx, torch.from_numpy(np.stack(new, axis=1))], dim=1)

    return run


@generator("onnx-fp32")
def onnx_fp32(model: GPT) -> Optional[Runner]:
    return _onnx_runner(model, "fp32")


@generator("onnx-int8")
def onnx_int8(model: GPT) -> Optional[Runner]:
    return _onnx_runner(model, "int8")


def load_models(args):
    """[(label, model)] for the requested presets (random init) or the checkpoint."""
    if args.ckpt:
        import pygpt

        model, _ = pygpt.load(args.ckpt, kernels=args.kernels[0])
        return [(f"ckpt {args.ckpt}", model)]
    models = []
    for name in args.preset:
        cfg = preset(name).model
        torch.manual_seed(0)
        models.append((name, GPT(cfg).eval()))
    return models


def bench_case(model, runners, threads, batch, new_tokens, prompt_tokens, repeat, warmup_tokens):
    torch.set_num_threads(threads)
    idx = torch.randint(model.config.vocab_size, (batch, prompt_tokens),
                        generator=torch.Generator().manual_seed(1))
    for run in runners.values():
        if run is not None and warmup_tokens:
            run(idx, warmup_tokens)
    times = {name: [] for name, run in runners.items() if run is not None}
    outputs = {}
    for r in range(repeat):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for name in order:
            t0 = time.perf_counter()
            out = runners[name](idx, new_tokens)
            times[name].append(time.perf_counter() - t0)
            outputs.setdefault(name, out)
    first = next(iter(outputs.values()), None)
    return {name: {"tokens_per_s": batch * new_tokens / statistics.median(ts),
                   "ms_per_step": 1e3 * statistics.median(ts) / new_tokens,
                   "same_tokens": name in APPROXIMATE or torch.equal(outputs[name], first)}
            for name, ts in times.items()}


def print_batch_ratios(rows) -> None:
    """Each batch size's tokens/s over batch 1's, per model, kernels, threads and generator."""
    ones = {(r[0], r[2], r[3]): r[5] for r in rows if r[4] == 1}
    for label, _, kernels, threads, batch, result in rows:
        base = ones.get((label, kernels, threads))
        if batch == 1 or base is None:
            continue
        cells = ", ".join(f"{name} {r['tokens_per_s'] / base[name]['tokens_per_s']:.1f}x"
                          for name, r in result.items() if name in base)
        print(f"# {label} {kernels} {threads}t: batch {batch} / batch 1 tokens/s: {cells}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", choices=list(PRESETS), default=["baby", "shakespeare"],
                   help="model shapes to run, random weights (default: baby shakespeare)")
    p.add_argument("--ckpt", default=None, help="a trained checkpoint folder instead of presets")
    p.add_argument("--threads", type=int, nargs="+", default=[1],
                   help="intra-op thread counts (default: 1)")
    p.add_argument("--kernels", nargs="+", choices=KERNEL_SETS, default=["ext"],
                   help="kernel sets to run the torch generators on (default: ext)")
    p.add_argument("--generators", nargs="+", choices=list(GENERATORS), default=list(GENERATORS),
                   help="which generators to time (default: all)")
    p.add_argument("--batch", type=int, nargs="+", default=[1],
                   help="batch sizes: prompts decoded together (default: 1)")
    p.add_argument("--new-tokens", type=int, default=500, help="tokens generated per prompt")
    p.add_argument("--prompt-tokens", type=int, default=1, help="prompt length in tokens")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per generator (median)")
    p.add_argument("--warmup-tokens", type=int, default=20,
                   help="an untimed short generation per generator first")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)
    if min(args.new_tokens, args.prompt_tokens, args.repeat, *args.batch) < 1:
        p.error("--new-tokens, --prompt-tokens, --repeat and --batch must be >= 1")

    print(f"# batch {' '.join(map(str, args.batch))}, prompt {args.prompt_tokens} token(s), "
          f"{args.new_tokens} new tokens per prompt, greedy, median of {args.repeat}")
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    busy_warning(args.threads)
    rows = []
    for label, model in load_models(args):
        c = model.config
        shape = (f"{c.n_layer}L {c.n_head}H {c.n_embd}d ctx {c.block_size}, "
                 f"{model.num_params() / 1e6:.2f}M params")
        for kernels in args.kernels:
            model.kernels = kernels
            runners = {name: GENERATORS[name](model) for name in args.generators}
            for threads in args.threads:
                for batch in args.batch:
                    result = bench_case(model, runners, threads, batch, args.new_tokens,
                                        args.prompt_tokens, args.repeat, args.warmup_tokens)
                    rows.append((label, shape, kernels, threads, batch, result))
                    if not args.markdown:
                        cells = "  ".join(
                            f"{name} {r['tokens_per_s']:9,.1f} tok/s"
                            + ("" if r["same_tokens"] else " (DIFFERENT TOKENS)")
                            for name, r in result.items())
                        print(f"{label:>12} [{shape}] {kernels:>5} {threads}t batch {batch:>3}: "
                              f"{cells}", flush=True)

    names = args.generators
    if args.markdown:
        cols = " | ".join(f"{n} tok/s" for n in names)
        speedup = "kv-cache/no-cache" if {"kv-cache", "no-cache"} <= set(names) else None
        print(f"| model | shape | kernels | threads | batch | {cols} |"
              + (f" {speedup} |" if speedup else "") + " same tokens |")
        print("|---|---|---|---:|---:|" + "---:|" * len(names) + ("---:|" if speedup else "")
              + "---|")
        for label, shape, kernels, threads, batch, result in rows:
            vals = " | ".join(f"{result[n]['tokens_per_s']:,.1f}" if n in result else "n/a"
                              for n in names)
            extra = ""
            if speedup and "kv-cache" in result and "no-cache" in result:
                ratio = result["kv-cache"]["tokens_per_s"] / result["no-cache"]["tokens_per_s"]
                extra = f" {ratio:.1f}x |"
            same = "yes" if all(r["same_tokens"] for r in result.values()) else "NO"
            print(f"| {label} | {shape} | {kernels} | {threads} | {batch} | {vals} |{extra} "
                  f"{same} |")
    print_batch_ratios(rows)
    if any(not r["same_tokens"] for *_, result in rows for r in result.values()):
        print("# WARNING: some generators produced different tokens than the first")


if __name__ == "__main__":
    main()
