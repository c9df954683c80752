#!/usr/bin/env python
"""BERT end to end on the shipped Shakespeare: masked-LM pretraining, then speaker attribution
(who of the 10 speakers with the most speeches says this speech; pygpt.speakers), against a
BERT trained on the labels alone and a TF-IDF + logistic-regression baseline.

Steps, each a command line run in a subprocess exactly as a user would run it:
1. `python -m pygpt.speakers` writes train.tsv, test.tsv and the pretraining text: the shipped
   text minus the test speeches, so pretraining never reads a test speech.
2. `python -m pygpt.train --arch bert` pretrains bert-baby on that text for --steps steps (8000,
   four times bert-baby's default: 14 minutes with --threads 2; fewer transfer worse); the
   table gives the last evaluation of metrics.jsonl (masked-LM loss and accuracy on masked
   tokens, next-sentence accuracy, on the held-out tenth of the text's lines) and the wall time.
3. `python -m pygpt.train --task classify` fine-tunes it (--init-from) on train.tsv for
   --ft-steps steps (bert-classify preset; validation: a held-out tenth of train.tsv), and trains
   the same model from scratch with the same settings (its WordPiece learned from train.tsv),
   once per --ft-seeds seed (initialisation of the head, data order, dropout), because one
   seed's macro-F1 on a few hundred test speeches moves by a few points.
4. Each classifier is scored on test.tsv with pygpt.classify's own functions (the numbers
   `python -m pygpt.classify --ckpt RUN --data test.tsv` prints). The baselines see the same
   training examples (train.tsv less the held-out tenth) and are scored with the same macro-F1:
   the majority class, and TF-IDF of word 1-2-grams + logistic regression (scikit-learn, only
   here; without it that row is skipped: `pip install scikit-learn`).

Usage:
  python benchmarks/bench_bert.py --threads 1           # 8000 pretraining steps, 4 seeds
  python benchmarks/bench_bert.py --threads 4 --workdir runs/bench-bert
  python benchmarks/bench_bert.py --quick               # a smoke test of the whole pipeline
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from machine import run_benchmark
from pygpt.classify import load_classifier, predict
from pygpt.presets import CLASSIFY_PRESET, preset
from pygpt.labelled_data import Encoded, counts, held_out_split, macro_f1, read_labelled
from pygpt.run_files import METRICS

REPO = Path(__file__).resolve().parent.parent
QUICK = {"steps": 20, "ft_steps": 20, "ft_seeds": [1]}
FT_SEEDS = [1337, 1, 2, 3]


def run(args: list[str], log: Path) -> float:
    """Runs `python -m args...` from the repository, its output into log; the wall seconds."""
    cmd = [sys.executable, "-m", *args]
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if code:
        tail = "".join(log.read_text(encoding="utf-8").splitlines(True)[-20:])
        raise SystemExit(f"error: {shlex.join(cmd)} failed (exit {code}); the end of {log}:\n"
                         f"{tail}")
    return wall


def last_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / METRICS).read_text(encoding="utf-8").splitlines()[-1])


def scores(predicted: torch.Tensor, true: torch.Tensor, num_labels: int) -> tuple[float, float]:
    """(accuracy, macro-F1), as pygpt.classify reports them."""
    accuracy = (predicted == true).sum().item() / len(true)
    return accuracy, macro_f1(*(c.tolist() for c in counts(predicted, true, num_labels)))


def score_checkpoint(ckpt: Path, test_path: Path) -> tuple[float, float]:
    model, tokenizer, labels = load_classifier(str(ckpt))
    encoded = Encoded(read_labelled(test_path), labels, tokenizer, model.config.block_size,
                      test_path)
    return scores(predict(model, encoded).argmax(-1), encoded.labels, len(labels))


def baselines(train_path: Path, test_path: Path) -> list[tuple[str, float, float, float]]:
    """(name, accuracy, macro-F1, wall seconds) of the majority class and TF-IDF + LR."""
    train, _ = held_out_split(read_labelled(train_path))  # what the classifiers train on
    test = read_labelled(test_path)
    labels = sorted({e.label for e in train})
    index = {label: i for i, label in enumerate(labels)}
    y_train = [index[e.label] for e in train]
    true = torch.tensor([index[e.label] for e in test])
    majority = max(set(y_train), key=lambda k: (y_train.count(k), -k))
    rows = [("majority class", *scores(torch.full_like(true, majority), true, len(labels)), 0.0)]
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        print("# scikit-learn is not installed: no TF-IDF + logistic regression row "
              "(pip install scikit-learn)")
        return rows
    t0 = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    features = vectorizer.fit_transform([e.text for e in train])
    classifier = LogisticRegression(max_iter=2000, C=10.0).fit(features, y_train)
    predicted = torch.as_tensor(classifier.predict(vectorizer.transform([e.text for e in test])))
    rows.append(("TF-IDF 1-2-grams + logistic regression",
                 *scores(predicted, true, len(labels)), time.perf_counter() - t0))
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=8000,
                   help="masked-LM pretraining steps (2000, bert-baby's own, transfer worse than "
                        "training from scratch on this task: see README)")
    p.add_argument("--ft-steps", type=int, default=preset(CLASSIFY_PRESET).train.max_iters,
                   help="classification steps, fine-tuned and from scratch alike")
    p.add_argument("--ft-seeds", type=int, nargs="+", default=FT_SEEDS,
                   help="a fine-tuning and a from-scratch run for each seed")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for every run (default: torch's choice)")
    p.add_argument("--speakers", type=int, default=10, help="how many speakers to tell apart")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    p.add_argument("--workdir", default=None, help="folder for the data, runs and logs, kept "
                                                   "(default: a temporary folder, removed)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke test: {QUICK['steps']} pretraining and {QUICK['ft_steps']} "
                        "fine-tuning steps, few evaluation batches (the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.ft_steps, args.ft_seeds = (QUICK["steps"], QUICK["ft_steps"],
                                                    QUICK["ft_seeds"])
    if min(args.steps, args.ft_steps) < 1 or (args.threads is not None and args.threads < 1):
        p.error("--steps, --ft-steps and --threads must be at least 1")
    if len(set(args.ft_seeds)) != len(args.ft_seeds):
        p.error(f"--ft-seeds must differ, got {args.ft_seeds}")
    return args


def bench(args: argparse.Namespace, work: Path) -> None:
    data, logs = work / "data", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pretrain_text = data / "pretrain.txt"
    run(["pygpt.speakers", "--out", str(data), "--speakers", str(args.speakers),
         "--seed", str(args.seed), "--pretrain-text", str(pretrain_text)], logs / "speakers.log")
    train_tsv, test_tsv = data / "train.tsv", data / "test.tsv"
    common = ["--quiet", "--overwrite"] + (["--threads", str(args.threads)] if args.threads else [])
    if args.quick:
        common += ["--eval-iters", "2"]
    bert = work / "bert"
    pretrain_wall = run(["pygpt.train", "--arch", "bert", "--data", str(pretrain_text),
                         "--out", str(bert), "--max-iters", str(args.steps), *common],
                        logs / "pretrain.log")
    mlm = last_metrics(bert)
    classify = ["--task", "classify", "--data", str(train_tsv), "--max-iters", str(args.ft_steps),
                *common]
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name, source, kind in (("BERT fine-tuned from the pretraining", ["--init-from", str(bert)],
                                "fine-tuned"),
                               ("BERT from scratch (labels only)", ["--arch", "bert"], "scratch")):
        runs = []
        for seed in args.ft_seeds:
            out = work / f"cls-{kind}-seed{seed}"
            wall = run(["pygpt.train", *classify, *source, "--seed", str(seed), "--out", str(out)],
                       logs / f"{kind}-seed{seed}.log")
            runs.append((f"{last_metrics(out)['val_f1']:.4f}", *score_checkpoint(out, test_tsv),
                         wall))
            rows.append((f"{name}, seed {seed}", str(args.ft_steps), *runs[-1]))
        if len(runs) > 1:
            rows.append((f"**{name}: mean of {len(runs)} seeds**", str(args.ft_steps), "-",
                         *(sum(r[i] for r in runs) / len(runs) for i in (1, 2, 3))))
    rows += [(name, "-", "-", acc, f1, wall) for name, acc, f1, wall
             in baselines(train_tsv, test_tsv)]

    n_test, n_train = len(read_labelled(test_tsv)), len(read_labelled(train_tsv))
    print("\n## Masked-LM pretraining (bert-baby, the shipped text minus the test speeches)\n")
    print("| steps | val masked-LM loss | val masked-LM acc | val next-sentence acc "
          "| tokens/s | wall s |")
    print("|---:|---:|---:|---:|---:|---:|")
    nsp = f"{mlm['val_nsp_acc']:.4f}" if "val_nsp_acc" in mlm else "-"
    print(f"| {mlm['step']} | {mlm['val_mlm_loss']:.4f} | {mlm['val_mlm_acc']:.4f} | {nsp} "
          f"| {mlm['tokens_per_s']:,.0f} | {pretrain_wall:.1f} |")
    print(f"\n## Speaker attribution ({args.speakers} speakers; {n_train} training speeches, a "
          f"tenth of them held out for validation; {n_test} test speeches)\n")
    print("| model | steps | val macro-F1 | test accuracy | test macro-F1 | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, steps, val, acc, f1, wall in rows:
        print(f"| {name} | {steps} | {val} | {acc:.4f} | {f1:.4f} | {wall:.1f} |")


def main(argv=None) -> None:
    args = parse_args(argv)
    run_benchmark("bench_bert", args, bench, threads=str(args.threads) if args.threads else
                  f"torch default ({torch.get_num_threads()})")


if __name__ == "__main__":
    main()
