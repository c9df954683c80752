#!/usr/bin/env python
"""Smaller and faster for deployment, per family: fp32, int8 (each option set), a distilled
student and the same student trained without the teacher, and any extra run folders (e.g.
pruned models, `--extra NAME=RUN`): parameters, graph size, onnxruntime latency at batch 1 on 1
thread (and tokens/s for generation), and quality, all measured on the exported graphs with the
torch-free runner (pygpt_runtime), so the int8 rows are measured as they ship.

- GPT: the teacher is the --teacher-flags model, the student the --student-flags one (half the
  layers by default), both trained --steps steps on the shipped Shakespeare; quality: val loss
  (nats) on the last tenth of the text, in whole context windows.
- BERT: speaker attribution (pygpt.speakers): per --seeds seed a classifier teacher, a distilled
  student and the plain student, each trained --steps steps from scratch; quality: accuracy and
  macro-F1 on test.tsv, mean and a 95% normal interval over the seeds (bench_bert.py's task).
- Translator: Multi30k (--data-dir, as bench_translate.py); quality: sacreBLEU of greedy
  translations of test_2016_flickr.

Every run is a command line in a subprocess, exactly as a user runs it. The real measurement,
on a quiet machine (about an hour per family at these sizes on one core):
  python benchmarks/bench_compress.py --family gpt --threads 1 --workdir runs/compress-gpt
  python benchmarks/bench_compress.py --family bert --threads 1 --seeds 1 2 3 4 --workdir runs/compress-bert
  python benchmarks/bench_compress.py --family seq2seq --threads 1 --workdir runs/compress-mt
  python benchmarks/bench_compress.py --family gpt --extra pruned=runs/pruned   # add a run folder
A smoke test of the whole pipeline (numbers mean nothing): --small.
"""
from __future__ import annotations

import argparse
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
from pygpt_runtime.onnx_translate import OnnxSeq2Seq, read_lines
from pygpt_runtime.run_onnx import OnnxGPT, stream

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "multi30k"
INT8 = {"int8": [], "int8-quint8-pc": ["--int8-weights", "quint8", "--int8-per-channel"],
        "int8-no-attn": ["--int8-exclude", "attention"], "int8-no-head": ["--int8-exclude", "head"]}
SIZES = {  # family: (teacher flags, student flags, --small's teacher and student)
    "gpt": ("--preset shakespeare", "--preset shakespeare --n-layer 3",
            "--n-layer 2 --n-embd 32 --n-head 2 --block-size 32", "--n-layer 1 --n-embd 32 "
            "--n-head 2 --block-size 32"),
    "bert": ("--arch bert --task classify", "--arch bert --task classify --n-layer 2",
             "--arch bert --task classify --n-layer 2 --n-embd 32 --n-head 2 --block-size 64 "
             "--vocab-size 400", "--arch bert --task classify --n-layer 1 --n-embd 32 "
             "--n-head 2 --block-size 64 --vocab-size 400"),
    "seq2seq": ("--arch seq2seq", "--arch seq2seq --n-layer 2",
                "--arch seq2seq --tokenizer char --n-layer 1 --n-embd 32 --n-head 2 "
                "--block-size 64 --max-tokens 400", "--arch seq2seq --tokenizer char --n-layer 1 "
                "--n-embd 16 --n-head 2 --block-size 64 --max-tokens 400 --bleu-sentences 4")}


def sh(*cmd: str) -> None:
    subprocess.run([sys.executable, *cmd], check=True, stdout=subprocess.DEVNULL, cwd=REPO)


def train(args, out: Path, flags: list[str], seed: int = 1337) -> Path:
    if not (out / "model.safetensors").exists():
        sh("-m", "pygpt.train", *flags, *data_flags(args), "--out", str(out), "--quiet",
           "--max-iters", str(args.steps), "--eval-interval", str(args.steps),
           "--seed", str(seed), "--threads", str(args.threads))
    return out


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
    """Each run's fp32 row and, for the teacher and extra runs, its int8 rows."""
    rows = {}
    for name, run in runs.items():
        for option, flags in INT8.items():
            if option != "int8" and name not in ("teacher",) and not name.startswith("extra:"):
                continue
            folder = export(run, work / "onnx" / f"{name}-{option}", flags)
            for variant in (["fp32"] if option == "int8" else []) + ["int8"]:
                label = f"{name} {variant if variant == 'fp32' else option}"
                rows[label] = {"params": params(run), **MEASURE[args.family](folder, variant, args)}
    return rows


def interval(values: list[float]) -> str:
    mean = statistics.mean(values)
    if all(float(v).is_integer() for v in values) and len(set(values)) == 1:
        return f"{int(values[0]):,}"
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
        runs = {"teacher": teacher,
                "distilled student": train(args, work / f"distilled-{seed}",
                                           student_flags + distil, seed),
                "plain student": train(args, work / f"plain-{seed}", student_flags, seed),
                **{f"extra:{k}": Path(v) for k, v in (e.split("=", 1) for e in args.extra)}}
        per_seed.append(rows_of(args, runs, work / f"seed-{seed}"))
    columns = list(next(iter(per_seed[0].values())))
    print(f"\n## {args.family}: {args.steps} steps, distillation T {args.temperature}, alpha "
          f"{args.alpha}; seeds {' '.join(map(str, args.seeds))} (mean ± 95% interval)\n")
    print("| model | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for label in per_seed[0]:
        cells = [interval([rows[label][c] for rows in per_seed]) for c in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=list(SIZES), required=True)
    p.add_argument("--steps", type=int, default=None, help="training steps of every run "
                   "(default 5000; --small 4)")
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
    args.steps = args.steps or 5000
    run_benchmark("bench_compress", args, bench, "1 (onnxruntime), --threads for training")


if __name__ == "__main__":
    main()
