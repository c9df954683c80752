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
   `--pretrained RUN` skips this step and fine-tunes RUN instead (the table says so; RUN should
   have been pretrained on this split's pretrain.txt, else it may have read test speeches).
3. `python -m pygpt.train --task classify` fine-tunes it (--init-from) on train.tsv for
   --ft-steps steps (bert-classify preset; validation: a held-out tenth of train.tsv), and trains
   the same model from scratch with the same settings (the preset's pooling for both; the
   scratch model's WordPiece learned from its training file),
   once per --ft-seeds seed (initialisation of the head, data order, dropout), because one
   seed's macro-F1 on a few hundred test speeches moves by a few points.
   `--label-fractions F...` repeats this step on stratified subsets of train.tsv (F of each
   speaker's speeches, drawn with --seed, written next to it as train-F.tsv, the same file for
   both models and every seed; the validation tenth is held out of the subset): how much
   pretraining helps when labels are few, the classic case for it.
4. Each classifier is scored on test.tsv with pygpt.classify's own functions (the numbers
   `python -m pygpt.classify --ckpt RUN --data test.tsv` prints). The baselines see the same
   training examples (train.tsv less the held-out tenth) and are scored with the same macro-F1:
   the majority class, and TF-IDF of word 1-2-grams + logistic regression (scikit-learn, only
   here; without it that row is skipped: `pip install scikit-learn`), per label fraction.

Usage:
  python benchmarks/bench_bert.py --threads 1           # 8000 pretraining steps, 4 seeds
  python benchmarks/bench_bert.py --threads 4 --workdir runs/bench-bert
  python benchmarks/bench_bert.py --quick               # a smoke test of the whole pipeline
  python benchmarks/bench_bert.py --threads 1 --pretrained runs/bert --label-fractions 0.1 0.25 1
"""
from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from machine import run_benchmark
from pygpt.classify import load_classifier, predict
from pygpt.families.bert import CLASSIFY_PRESET
from pygpt.config.presets import preset
from pygpt.data.labelled import Encoded, counts, held_out_split, macro_f1, read_labelled
from pygpt.storage.atomic import atomic_write_text
from pygpt.storage.run_files import METRICS
from pygpt.speakers import Speech, tsv

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


def label_subset(train_tsv: Path, fraction: float, seed: int) -> Path:
    """train_tsv itself for 1; else round(fraction * n) (at least 2) of each label's n examples,
    drawn with seed, in file order, written next to it as train-FRACTION.tsv."""
    if fraction == 1:
        return train_tsv
    examples, rng = read_labelled(train_tsv), random.Random(seed)
    by_label: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        by_label.setdefault(e.label, []).append(i)
    keep = {i for label in sorted(by_label) for i in
            rng.sample(by_label[label], max(2, round(fraction * len(by_label[label]))))}
    path = train_tsv.with_name(f"train-{fraction:g}.tsv")
    atomic_write_text(path, tsv([Speech(e.label, e.text, 0, 0)
                                 for i, e in enumerate(examples) if i in keep]))
    return path


def pretraining_note(run_dir: Path, pretrain_text: Path) -> str:
    """Where a reused pretraining's text came from, warning when it is not this split's."""
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    source = Path(config.get("train", {}).get("data", ""))
    same = source.is_file() and source.read_bytes() == pretrain_text.read_bytes()
    return (f"reused {run_dir}, pretrained on {source}" + (
        f" (the same text as {pretrain_text})" if same else
        f": WARNING not the same text as {pretrain_text}, it may have read test speeches"))


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
    p.add_argument("--pretrained", type=Path, default=None,
                   help="fine-tune this pretrained BERT run instead of pretraining (step 2)")
    p.add_argument("--label-fractions", type=float, nargs="+", default=[1.0],
                   help="fractions of train.tsv to fine-tune and train from scratch on "
                        "(stratified by speaker, the same subset for every run)")
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
    if len(set(args.label_fractions)) != len(args.label_fractions) or not all(
            0 < f <= 1 for f in args.label_fractions):
        p.error(f"--label-fractions must differ and lie in (0, 1], got {args.label_fractions}")
    if args.pretrained is not None and not (args.pretrained / "config.json").is_file():
        p.error(f"--pretrained {args.pretrained}: not a run folder (no config.json)")
    return args


def print_pretraining(mlm: dict, wall: str) -> None:
    print("\n## Masked-LM pretraining (bert-baby, the shipped text minus the test speeches)\n")
    print("| steps | val masked-LM loss | val masked-LM acc | val next-sentence acc "
          "| tokens/s | wall s |")
    print("|---:|---:|---:|---:|---:|---:|")
    nsp = f"{mlm['val_nsp_acc']:.4f}" if "val_nsp_acc" in mlm else "-"
    print(f"| {mlm['step']} | {mlm['val_mlm_loss']:.4f} | {mlm['val_mlm_acc']:.4f} | {nsp} "
          f"| {mlm['tokens_per_s']:,.0f} | {wall} |")


def attribution(args: argparse.Namespace, work: Path, train_path: Path, test_tsv: Path,
                bert: Path, common: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Steps 3 and 4 on train_path: prints the table; per model kind and baseline, the
    (accuracy, macro-F1) of each seed (one pair for a baseline)."""
    # Both with the from-scratch preset (its rate suits a minutes-old pretraining; with
    # --init-from the default would be bert-classify-pretrained, BERT's recipe for a full one).
    classify = ["--task", "classify", "--preset", CLASSIFY_PRESET, "--data", str(train_path),
                "--max-iters", str(args.ft_steps), *common]
    tag = "" if train_path.stem == "train" else "-" + train_path.stem.removeprefix("train-")
    rows, results = [], {}
    # --init-from keeps the source's pooling unless told: a pretraining saved before mean
    # pooling became the default would read the [CLS] pooler, which only next-sentence trains
    fine_tune = ["--init-from", str(bert), "--pooling", preset(CLASSIFY_PRESET).model.pooling]
    for name, source, kind in (("BERT fine-tuned from the pretraining", fine_tune, "fine-tuned"),
                               ("BERT from scratch (labels only)", ["--arch", "bert"], "scratch")):
        runs = []
        for seed in args.ft_seeds:
            out = work / f"cls-{kind}{tag}-seed{seed}"
            wall = run(["pygpt.train", *classify, *source, "--seed", str(seed), "--out", str(out)],
                       work / "logs" / f"{kind}{tag}-seed{seed}.log")
            runs.append((f"{last_metrics(out)['val_f1']:.4f}", *score_checkpoint(out, test_tsv),
                         wall))
            rows.append((f"{name}, seed {seed}", str(args.ft_steps), *runs[-1]))
        if len(runs) > 1:
            rows.append((f"**{name}: mean of {len(runs)} seeds**", str(args.ft_steps), "-",
                         *(sum(r[i] for r in runs) / len(runs) for i in (1, 2, 3))))
        results[kind] = [(acc, f1) for _, acc, f1, _ in runs]
    for name, acc, f1, wall in baselines(train_path, test_tsv):
        rows.append((name, "-", "-", acc, f1, wall))
        results[name] = [(acc, f1)]

    n_test, n_train = len(read_labelled(test_tsv)), len(read_labelled(train_path))
    print(f"\n## Speaker attribution ({args.speakers} speakers; {n_train} training speeches "
          f"({train_path.name}), a tenth of them held out for validation; {n_test} test "
          "speeches)\n")
    print("| model | steps | val macro-F1 | test accuracy | test macro-F1 | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, steps, val, acc, f1, wall in rows:
        print(f"| {name} | {steps} | {val} | {acc:.4f} | {f1:.4f} | {wall:.1f} |")
    return results


def mean_and_seeds(values: list[float]) -> str:
    """'0.3300 (0.307, 0.343)': the mean, then each seed's value."""
    return f"{sum(values) / len(values):.4f} ({', '.join(f'{v:.3f}' for v in values)})"


def print_label_efficiency(args: argparse.Namespace, sizes: list[int],
                           results: list[dict[str, list[tuple[float, float]]]]) -> None:
    """One row per label fraction: both models' mean and per-seed test scores, their paired
    per-seed macro-F1 differences, and TF-IDF + LR's macro-F1."""
    tfidf = next((k for k in results[0] if k.startswith("TF-IDF")), None)
    print(f"\n## Label efficiency (seeds {', '.join(map(str, args.ft_seeds))}; test macro-F1 "
          "and accuracy: mean (per seed))\n")
    print("| fraction | training speeches | pretrained macro-F1 | scratch macro-F1 | pretrained "
          "minus scratch macro-F1 | pretrained accuracy | scratch accuracy | TF-IDF + LR "
          "macro-F1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fraction, n, r in zip(args.label_fractions, sizes, results):
        pre, scratch = r["fine-tuned"], r["scratch"]
        diff = [p[1] - s[1] for p, s in zip(pre, scratch)]
        print(f"| {fraction:g} | {n} | {mean_and_seeds([f for _, f in pre])} | "
              f"{mean_and_seeds([f for _, f in scratch])} | {mean_and_seeds(diff)} | "
              f"{mean_and_seeds([a for a, _ in pre])} | {mean_and_seeds([a for a, _ in scratch])}"
              f" | {f'{r[tfidf][0][1]:.4f}' if tfidf else '-'} |")


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
    if args.pretrained is not None:
        bert, wall = args.pretrained, "reused"
        print("# pretraining: " + pretraining_note(bert, pretrain_text))
    else:
        bert = work / "bert"
        seconds = run(["pygpt.train", "--arch", "bert", "--data", str(pretrain_text),
                       "--out", str(bert), "--max-iters", str(args.steps), *common],
                      logs / "pretrain.log")
        wall = f"{seconds:.1f}"
    print_pretraining(last_metrics(bert), wall)
    if args.threads:
        torch.set_num_threads(args.threads)
    subsets = [label_subset(train_tsv, f, args.seed) for f in args.label_fractions]
    results = [attribution(args, work, path, test_tsv, bert, common) for path in subsets]
    if args.label_fractions != [1.0]:
        print_label_efficiency(args, [len(read_labelled(p)) for p in subsets], results)


def main(argv=None) -> None:
    args = parse_args(argv)
    run_benchmark("bench_bert", args, bench, threads=str(args.threads) if args.threads else
                  f"torch default ({torch.get_num_threads()})")


if __name__ == "__main__":
    main()
