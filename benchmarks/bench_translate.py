#!/usr/bin/env python
"""The translator end to end on Multi30k German -> English: train the `seq2seq` preset with
`python -m pygpt.train --arch seq2seq` for a step or wall-time budget, then translate
test_2016_flickr by beam search and score it with sacreBLEU.

Steps:
1. `python -m pygpt.train --arch seq2seq --src-data train.de.gz --tgt-data train.en.gz
   --val-src val.de.gz --val-tgt val.en.gz` in a subprocess, exactly as a user runs it, for
   --steps optimizer steps (default: the preset's); with --minutes, the run is sent SIGTERM once
   that much wall time has passed, and it finishes its step, evaluates and saves (exit 143), as
   a user's Ctrl-C would. The preset's wsd schedule decays over the last fifth of --steps: a run
   cut by --minutes before then misses that decay, so size --steps to the time (--minutes is
   a cap), or pass --schedule inverse_sqrt through --train-flags, which has no end.
2. test_2016_flickr.de is translated with the checkpoint by pygpt.translate's functions
   (pygpt.decoding.translate_texts with beam 4 and length penalty 0.6, as `python -m pygpt.translate
   --file ... --ref ...`), and scored against test_2016_flickr.en by pygpt.tasks.bleu: sacreBLEU's
   BLEU (13a tokenization, case-sensitive), the same lowercased (the figure the data's README
   quotes: 36.5 for a 3+3-layer 256-wide Transformer after 10 GPU epochs) and chrF.

Usage (from the repository root; the data sits beside it in ../shared/data/multi30k):
  python benchmarks/bench_translate.py                      # the preset's steps
  python benchmarks/bench_translate.py --minutes 30 --threads 2
  python benchmarks/bench_translate.py --quick              # a smoke test of the pipeline
"""
from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench_bert import last_metrics
from machine import run_benchmark
from pygpt.tasks.bleu import score
from pygpt.storage.checkpoint import load
from pygpt.data.parallel import read_lines
from pygpt.decoding.translate_texts import translate_texts
from pygpt.decoding.beam_search import Search

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "multi30k"
# A smoke test: few steps and evaluation batches, BLEU on a few sentences.
QUICK = ["--eval-interval", "10", "--eval-iters", "2", "--bleu-sentences", "10"]
QUICK_STEPS, QUICK_TEST_LINES = 20, 40


def train(args: argparse.Namespace, out: Path, log: Path) -> float:
    """Runs the training command line into out (its output into log); its wall seconds."""
    d = args.data_dir
    cmd = [sys.executable, "-m", "pygpt.train", "--arch", "seq2seq", "--out", str(out),
           "--src-data", str(d / "train.de.gz"), "--tgt-data", str(d / "train.en.gz"),
           "--val-src", str(d / "val.de.gz"), "--val-tgt", str(d / "val.en.gz"),
           "--quiet", "--overwrite"]
    cmd += (["--max-iters", str(args.steps)] if args.steps else []) + (QUICK if args.quick else [])
    cmd += (["--threads", str(args.threads)] if args.threads else []) + args.train_flags
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=args.minutes * 60 if args.minutes else None)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # finish the step, evaluate, save, exit 143
            code = proc.wait()
            code = 0 if code == 128 + signal.SIGTERM else code
        except BaseException:
            proc.kill()
            raise
    wall = time.perf_counter() - t0
    if code:
        tail = "".join(log.read_text(encoding="utf-8").splitlines(True)[-20:])
        raise SystemExit(f"error: {shlex.join(cmd)} failed (exit {code}); the end of {log}:\n"
                         f"{tail}")
    return wall


def bench(args: argparse.Namespace, work: Path) -> None:
    out, log = work / "mt", work / "train.log"
    wall = train(args, out, log)
    metrics = last_metrics(out)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(str(out))
    sources = list(read_lines(args.data_dir / "test_2016_flickr.de.gz"))[:args.test_lines]
    refs = list(read_lines(args.data_dir / "test_2016_flickr.en.gz"))[:args.test_lines]
    t0 = time.perf_counter()
    hyps, _ = translate_texts(model, tokenizer, sources, Search(beam=args.beam))
    translate_wall = time.perf_counter() - t0
    scores = score(hyps, refs)
    params = sum(p.numel() for p in model.parameters())
    print(f"\n## Multi30k de->en, preset seq2seq ({params / 1e6:.1f}M parameters, "
          f"{tokenizer.vocab_size} joint BPE tokens)\n")
    print("| steps | tokens | train wall s | tokens/s | val loss | val BLEU (greedy) | "
          f"test BLEU ({len(hyps)} sents) | test BLEU lc | test chrF | translate s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    val_bleu = f"{metrics['val_bleu']:.2f}" if "val_bleu" in metrics else "-"
    print(f"| {metrics['step']} | {metrics['tokens']:,} | {wall:.0f} | "
          f"{metrics['tokens_per_s']:,.0f} | {metrics['val_loss']:.4f} | {val_bleu} | "
          f"{scores.bleu:.2f} | {scores.bleu_lowercase:.2f} | {scores.chrf:.2f} | "
          f"{translate_wall:.1f} |")
    print(f"\n# test: beam {args.beam}, length penalty 0.6, on the first {len(hyps)} sentences of "
          f"test_2016_flickr; val BLEU: greedy, on the first sentences of val at the last "
          f"evaluation; train wall time includes the tokenizer and evaluations")
    for source, ref, hyp in list(zip(sources, refs, hyps))[:3]:
        print(f"#   {source}\n#   -> {hyp}\n#   (reference: {ref})")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=DATA,
                   help="folder with Multi30k's train, val and test_2016_flickr .de.gz / .en.gz "
                        "(default: ../shared/data/multi30k beside the repository)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default: the seq2seq preset's --max-iters)")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop training after this much wall time (SIGTERM: the run saves)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for training and translating (default: "
                        "pygpt.train's, half the CPUs)")
    p.add_argument("--train-flags", type=shlex.split, default=[],
                   help="more flags for pygpt.train, in one string with an equals sign: "
                        "--train-flags='--schedule inverse_sqrt --lr 2e-3'")
    p.add_argument("--beam", type=int, default=4, help="beam size for the test set (default 4)")
    p.add_argument("--test-lines", type=int, default=None,
                   help="translate only the first N test sentences (default: all 1000)")
    p.add_argument("--workdir", default=None, help="folder for the run and its log, kept "
                                                   "(default: a temporary folder, removed)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke test: {QUICK_STEPS} steps, {QUICK_TEST_LINES} test sentences, "
                        "few evaluation batches (the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = args.steps or QUICK_STEPS
        args.test_lines = args.test_lines or QUICK_TEST_LINES
    for name in ("steps", "threads", "beam", "test_lines"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.minutes is not None and not args.minutes > 0:
        p.error("--minutes must be positive")
    missing = [n for n in ("train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz",
                           "test_2016_flickr.de.gz", "test_2016_flickr.en.gz")
               if not (args.data_dir / n).is_file()]
    if missing:
        p.error(f"--data-dir {args.data_dir} lacks {', '.join(missing)}")
    args.data_dir = args.data_dir.resolve()
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    budget = (f"budget: {args.steps or 'the preset'} steps"
              + (f", at most {args.minutes:g} minutes" if args.minutes else ""))
    run_benchmark("bench_translate", args, bench, threads=str(args.threads or
                  "pygpt.train default"), notes=[budget], folder_note="training log: train.log")


if __name__ == "__main__":
    main()
