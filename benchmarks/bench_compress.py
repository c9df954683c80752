#!/usr/bin/env python
"""Smaller and faster for deployment, per family: the fp32 teacher, its int8 exports (each
option set), structurally pruned copies of it (--prune, each also in int8), a distilled student
and the same student trained without the teacher, and for each pruned size the same shape
trained from scratch as long (teacher steps + recovery steps): parameters, graph size,
onnxruntime latency at batch 1 on 1 thread (and tokens/s for generation), and quality, all
measured on the exported graphs with the torch-free runner (pygpt_runtime), so the int8 rows are
measured as they ship.

- GPT: the `baby` preset as teacher, 2 of its 4 layers as student, on the shipped Shakespeare
  (default 2000 steps, the default run's); quality: val loss (nats) on the last tenth of the
  text, in whole context windows.
- BERT: speaker attribution (pygpt.speakers): per --seeds seed a `bert-classify` teacher, a
  distilled 2-layer student and the plain student, each trained --steps steps from scratch
  (default 600, the preset's); quality: accuracy and macro-F1 on test.tsv, mean and a 95% normal
  interval over the seeds (bench_bert.py's task).
- Translator: the `seq2seq` preset on Multi30k (--data-dir, as bench_translate.py), student 2
  layers (default 600 steps); quality: sacreBLEU of greedy translations of test_2016_flickr.

Pruning is `python -m pygpt.prune --heads-per-layer K --mlp-fraction F --recover-iters R` on the
teacher (--prune K:F, default 2:0.5 and 1:0.75: every layer alike), or with `--head-fraction H`
for Michel et al.'s global ranking of heads and MLP units (--prune gH:F, default g0.5:0.5 for
the GPT and BERT: layers keep different numbers, and scratch gH:F trains that shape too); R =
--recover-iters, default a quarter of the steps. Every run is a command line in a subprocess,
exactly as a user runs it. The real measurement, on a quiet machine (2-core AMD EPYC, one thread
each: GPT about 25 min, BERT about 10 min per seed, translator about 70 min):
  python benchmarks/bench_compress.py --family gpt --workdir runs/compress-gpt
  python benchmarks/bench_compress.py --family bert --seeds 1 2 3 4 --workdir runs/compress-bert
  python benchmarks/bench_compress.py --family seq2seq --workdir runs/compress-mt
  python benchmarks/bench_compress.py --family gpt --extra other=runs/other   # add a run folder
A smoke test of the whole pipeline (numbers mean nothing): --small.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from machine import run_benchmark
from pygpt.data.text import SHIPPED_TEXT
from pygpt_runtime.onnx_bert import OnnxBERT
from pygpt_runtime.onnx_search import Search
from pygpt_runtime.onnx_seq2seq import OnnxSeq2Seq, read_lines
from pygpt_runtime.run_onnx import OnnxGPT, stream

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "multi30k"
INT8 = {"int8": [], "int8-quint8-pc": ["--int8-weights", "quint8", "--int8-per-channel"],
        "int8-no-attn": ["--int8-exclude", "attention"], "int8-no-head": ["--int8-exclude", "head"]}
SIZES = {  # family: (teacher flags, student flags, --small's teacher and student)
    "gpt": ("--preset baby", "--preset baby --n-layer 2",
            "--n-layer 2 --n-embd 32 --n-head 2 --block-size 32", "--n-layer 1 --n-embd 32 "
            "--n-head 2 --block-size 32"),
    "bert": ("--arch bert --task classify", "--arch bert --task classify --n-layer 2",
             "--arch bert --task classify --n-layer 2 --n-embd 32 --n-head 2 --block-size 64 "
             "--vocab-size 400", "--arch bert --task classify --n-layer 1 --n-embd 32 "
             "--n-head 2 --block-size 64 --vocab-size 400"),
    "seq2seq": ("--arch seq2seq --warmup-iters 60",
                "--arch seq2seq --warmup-iters 60 --n-layer 2",
                "--arch seq2seq --tokenizer char --n-layer 1 --n-embd 32 --n-head 2 "
                "--block-size 64 --max-tokens 400", "--arch seq2seq --tokenizer char --n-layer 1 "
                "--n-embd 16 --n-head 2 --block-size 64 --max-tokens 400 --bleu-sentences 4")}
STEPS = {"gpt": 2000, "bert": 600, "seq2seq": 600}  # each family's preset length (seq2seq: shorter)


def sh(*cmd: str) -> None:
    subprocess.run([sys.executable, *cmd], check=True, stdout=subprocess.DEVNULL, cwd=REPO)


def train(args, out: Path, flags: list[str], seed: int = 1337, steps: int = 0) -> Path:
    steps = steps or args.steps
    if not (out / "model.safetensors").exists():
        sh("-m", "pygpt.train", *flags, *data_flags(args), "--out", str(out), "--quiet",
           "--max-iters", str(steps), "--eval-interval", str(steps),
           "--seed", str(seed), "--threads", str(args.threads))
    return out


def prune(args, teacher: Path, out: Path, size: str) -> Path:
    heads, fraction = size.split(":")
    how = ["--head-fraction", heads[1:]] if heads.startswith("g") else ["--heads-per-layer", heads]
    if not (out / "model.safetensors").exists():
        sh("-m", "pygpt.prune", "--ckpt", str(teacher), "--out", str(out), "--quiet",
           *how, "--mlp-fraction", fraction,
           "--recover-iters", str(args.recover_iters), "--threads", str(args.threads))
    return out


def shape_flags(run: Path) -> list[str]:
    """The flags that train a model of run's (pruned) shape from scratch."""
    model = json.loads((run / "config.json").read_text(encoding="utf-8"))["model"]

    def flag_value(value) -> str:  # per-layer sizes (a list) as their flag takes them
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)

    return [f for name in ("n_head", "qk_dim", "v_dim", "mlp_dim", "layer_heads",
                           "layer_mlp_dims") if model.get(name)
            for f in (f"--{name.replace('_', '-')}", flag_value(model[name]))]


def data_flags(args) -> list[str]:
    if args.family == "bert":
        return ["--data", str(args.speakers / "train.tsv")]
    if args.family == "seq2seq":
        return [f for name, file in [("src-data", "train.de.gz"), ("tgt-data", "train.en.gz"),
                                     ("val-src", "val.de.gz"), ("val-tgt", "val.en.gz")]
                for f in (f"--{name}", str(args.data_dir / file))]
    return []


def export(run: Path, out: Path, int8_flags: list[str]) -> Path:
    if not (out / "runner.json").exists():
        sh("-m", "pygpt.export", "--ckpt", str(run), "--out", str(out), "--quantize", "int8",
           *int8_flags)
    return out


def graph_bytes(folder: Path, model) -> int:
    files = model.config["models"][model.variant]
    return sum((folder / f).stat().st_size for f in (files.values() if isinstance(files, dict)
                                                     else [files]))


def timed(fn, repeats: int) -> float:
    """The median seconds of fn() over repeats runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_gpt(folder: Path, variant: str, args) -> dict:
    model = OnnxGPT(str(folder), variant, threads=1)
    model.variant = variant
    block = model.config["block_size"]
    text = SHIPPED_TEXT.read_text(encoding="utf-8")
    ids = np.array(model.tokenizer.encode(text[len(text) * 9 // 10:]))
    windows = [ids[i:i + block + 1] for i in range(0, len(ids) - block - 1, block)]
    losses = []
    for w in windows[:args.eval_windows]:
        logits = model.step(w[None, :-1], model.empty_past(1))[0][0].astype(np.float64)
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        losses.append(-logp[np.arange(block), w[1:]].mean())
    n = args.gen_tokens
    seconds = timed(lambda: list(stream(model, ids[None, :8], n, greedy=True)), args.repeats)
    return {"val loss": float(np.mean(losses)), "ms/token": 1e3 * seconds / n,
            "tokens/s": n / seconds, "MB": graph_bytes(folder, model) / 1e6}


def measure_bert(folder: Path, variant: str, args) -> dict:
    from pygpt.data.labelled import read_labelled

    model = OnnxBERT(str(folder), variant, threads=1)
    model.variant = variant
    test = read_labelled(args.speakers / "test.tsv")[:args.test_lines]
    predicted = [model.labels[int(p.argmax())] for p in model.classify([e.text for e in test])]
    truth = [e.label for e in test]
    f1s = []
    for label in model.labels:
        tp = sum(p == t == label for p, t in zip(predicted, truth))
        fp = sum(p == label != t for p, t in zip(predicted, truth))
        fn = sum(t == label != p for p, t in zip(predicted, truth))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    seconds = timed(lambda: model.classify([test[0].text]), args.repeats)
    return {"acc": float(np.mean([p == t for p, t in zip(predicted, truth)])),
            "macro-F1": float(np.mean(f1s)), "ms": 1e3 * seconds,
            "MB": graph_bytes(folder, model) / 1e6}


def measure_seq2seq(folder: Path, variant: str, args) -> dict:
    from pygpt.tasks.bleu import score

    model = OnnxSeq2Seq(str(folder), variant, threads=1)
    model.variant = variant
    src = read_lines(str(args.data_dir / "test_2016_flickr.de.gz"))[:args.test_lines]
    ref = read_lines(str(args.data_dir / "test_2016_flickr.en.gz"))[:args.test_lines]
    seconds = timed(lambda: model.translate(src[:1], Search()), args.repeats)
    return {"BLEU": score(model.translate(src, Search()), ref).bleu, "ms/sentence": 1e3 * seconds,
            "MB": graph_bytes(folder, model) / 1e6}


MEASURE = {"gpt": measure_gpt, "bert": measure_bert, "seq2seq": measure_seq2seq}


def params(run: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(run / "model.safetensors"), "pt") as f:
        return sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())


def rows_of(args, runs: dict[str, Path], work: Path) -> dict[str, dict]:
    """Each run's fp32 row; the int8 rows of every option for the teacher and extra runs, of the
    default option for the pruned ones."""
    rows = {}
    for name, run in runs.items():
        every = name == "teacher" or name.startswith("extra:")
        with_int8 = every or name.startswith("pruned")
        for option in INT8 if every else ["int8"]:
            folder = export(run, work / "onnx" / f"{name}-{option}", INT8[option])
            variants = (["fp32"] if option == "int8" else []) + (["int8"] if with_int8 else [])
            for variant in variants:
                label = f"{name} {variant if variant == 'fp32' else option}"
                rows[label] = {"params": params(run), **MEASURE[args.family](folder, variant, args)}
    return rows


def interval(values: list[float]) -> str:
    mean = statistics.mean(values)
    if all(isinstance(v, int) for v in values) and len(set(values)) == 1:
        return f"{int(values[0]):,}"
    if len(values) == 1:
        return f"{mean:.3f}"
    half = 1.96 * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {half:.3f}"


def bench(args, work: Path) -> None:
    teacher_flags, student_flags = (SIZES[args.family][2:] if args.small
                                    else SIZES[args.family][:2])
    teacher_flags, student_flags = shlex.split(teacher_flags), shlex.split(student_flags)
    if args.family == "bert":
        args.speakers = work / "speakers"
        if not (args.speakers / "test.tsv").exists():
            sh("-m", "pygpt.speakers", "--out", str(args.speakers))
    per_seed = []
    for seed in args.seeds:
        teacher = train(args, work / f"teacher-{seed}", teacher_flags, seed)
        distil = ["--distill-from", str(teacher), "--distill-temperature",
                  str(args.temperature), "--distill-alpha", str(args.alpha)]
        runs = {"teacher": teacher}
        for size in args.prune:
            pruned = prune(args, teacher, work / f"pruned-{size.replace(':', '-')}-{seed}", size)
            runs[f"pruned {size}"] = pruned
            runs[f"scratch {size}"] = train(
                args, work / f"scratch-{size.replace(':', '-')}-{seed}",
                teacher_flags + shape_flags(pruned), seed, args.steps + args.recover_iters)
        runs.update({"distilled student": train(args, work / f"distilled-{seed}",
                                                student_flags + distil, seed),
                     "plain student": train(args, work / f"plain-{seed}", student_flags, seed),
                     **{f"extra:{k}": Path(v) for k, v in (e.split("=", 1) for e in args.extra)}})
        per_seed.append(rows_of(args, runs, work / f"seed-{seed}"))
    columns = list(next(iter(per_seed[0].values())))
    print(f"\n## {args.family}: {args.steps} steps, distillation T {args.temperature}, alpha "
          f"{args.alpha}; pruned K:F = K heads per layer, fraction F of each layer's MLP units "
          f"removed; pruned gH:F = fractions H of all heads and F of all MLP units removed (one "
          f"ranking over every layer); {args.recover_iters} recovery steps; scratch K:F = that "
          f"shape trained {args.steps + args.recover_iters} steps; seeds "
          f"{' '.join(map(str, args.seeds))} "
          "(mean ± 95% interval)\n")
    print("| model | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for label in per_seed[0]:
        cells = [interval([rows[label][c] for rows in per_seed]) for c in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=list(SIZES), required=True)
    p.add_argument("--steps", type=int, default=None, help="training steps of the teacher and "
                   "students (default: gpt 2000, bert 600, seq2seq 600; --small 4)")
    p.add_argument("--prune", nargs="*", default=None, metavar="K:F",
                   help="pruned sizes: K heads kept per layer and fraction F of each layer's MLP "
                        "units removed, or gH:F: fractions H of all heads and F of all MLP "
                        "units removed by one global ranking (default: 2:0.5 1:0.75, and "
                        "g0.5:0.5 but for seq2seq)")
    p.add_argument("--recover-iters", type=int, default=None,
                   help="fine-tuning steps after pruning (default: a quarter of --steps)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--extra", nargs="*", default=[], metavar="NAME=RUN",
                   help="more run folders (e.g. pruned models) measured like the others")
    p.add_argument("--data-dir", type=Path, default=DATA, help="seq2seq: Multi30k's raw files")
    p.add_argument("--threads", type=int, default=1, help="training threads (measured: 1)")
    p.add_argument("--eval-windows", type=int, default=200)
    p.add_argument("--test-lines", type=int, default=None)
    p.add_argument("--gen-tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--workdir", default=None)
    p.add_argument("--small", action="store_true", help="a smoke test of the whole pipeline")
    args = p.parse_args(argv)
    args.quick = args.small
    if args.small:
        args.steps = args.steps or 4
        args.eval_windows, args.gen_tokens, args.repeats = 4, 8, 2
        args.test_lines = args.test_lines or 12
    args.steps = args.steps or STEPS[args.family]
    if args.recover_iters is None:
        args.recover_iters = args.steps // 4
    if args.prune is None:
        args.prune = ["2:0.5", "1:0.75"] + (["g0.5:0.5"] if args.family != "seq2seq" else [])
    for size in args.prune:
        heads, _, fraction = size.partition(":")
        try:
            ok = ((0 <= float(heads[1:]) < 1) if heads.startswith("g")
                  else heads.isdigit() and int(heads) > 0) and 0 <= float(fraction) < 1
        except ValueError:
            ok = False
        if not ok:
            p.error(f"--prune takes K:F or gH:F (K heads kept per layer, or a fraction H of all "
                    f"heads removed by one global ranking; F in [0, 1)), got {size!r}")
    run_benchmark("bench_compress", args, bench, "1 (onnxruntime), --threads for training")


if __name__ == "__main__":
    main()
