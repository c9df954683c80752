"""Fine-tuning an imported pretrained encoder to classify sentences: pygpt's defaults against
plain transformers code running the same recipe on the same model, data and seeds.

    python benchmarks/bench_finetune.py --hf MODEL_DIR --train train.tsv --val dev.tsv \\
        --rows 4000 --seeds 1 2 --out runs/finetune

MODEL_DIR is a local Hugging Face BERT folder (config.json, model.safetensors, vocab.txt); the
TSV files hold a label column and a text column (the first two columns; a header line). The
training rows are a seeded sample of --rows of --train. For each seed:

- pygpt: `python -m pygpt.convert --from-hf MODEL_DIR` once, then `python -m pygpt.train --task
  classify --init-from` it with nothing else (its defaults for a pretrained source: the preset
  bert-classify-pretrained), scored by `python -m pygpt.classify --data` on --val. With
  --old-preset, also the same with `--preset bert-classify` (the from-scratch preset);
- transformers: BertForSequenceClassification from MODEL_DIR, fine-tuned by a plain PyTorch loop
  with the same recipe (AdamW lr, betas (0.9, 0.999), weight decay 0.01 off biases and norms,
  10% linear warmup then linear decay to 0, batch 32, gradient norm clipped at 1, the same
  epochs), batches padded to their longest row, scored on --val.

Both sides score the model of the last step (no choice of the best checkpoint on --val). Prints
each run's validation accuracy and seconds per training step (the steps alone), then the mean per
side. Timings depend on what else the machine runs: run it on a quiet one.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from pygpt.config.presets import FROM_PRETRAINED


def read_rows(path: Path) -> list[tuple[str, str]]:
    """(label, text) of each data line of a TSV with a header."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        return [(row[0], row[1]) for row in reader if len(row) >= 2 and row[1].strip()]


def write_rows(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("label\ttext\n")
        for label, text in rows:
            f.write(f"{label}\t{text}\n")
    return path


def pygpt_run(imported: Path, train: Path, val: Path, out: Path, seed: int, threads: int,
              extra: list[str]) -> dict:
    """pygpt's fine-tune of the imported model: its validation accuracy and seconds a step (of
    the steps alone, as its log counts them)."""
    command = [sys.executable, "-m", "pygpt.train", "--task", "classify", "--init-from",
               str(imported), "--data", str(train), "--val-data", str(val), "--out", str(out),
               "--seed", str(seed), "--threads", str(threads), "--json",
               "--eval-interval", "1000000", "--overwrite", *extra]  # one evaluation: the last
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    settings = next(line for line in done.stdout.splitlines() if "settings:" in line)
    last = json.loads(done.stdout.strip().splitlines()[-1])
    steps, seconds = last["step"], last["tokens"] / last["tokens_per_s"]  # the steps' own time
    scored = subprocess.run([sys.executable, "-m", "pygpt.classify", "--ckpt", str(out),
                             "--data", str(val)], check=True, capture_output=True, text=True)
    accuracy = float(scored.stdout.split()[1])
    return {"accuracy": accuracy, "s_per_step": seconds / steps, "steps": steps,
            "settings": settings.strip()}


def transformers_run(hf_dir: Path, train: list[tuple[str, str]], val: list[tuple[str, str]],
                     labels: list[str], seed: int, threads: int, epochs: float, lr: float,
                     batch: int) -> dict:
    """transformers' BertForSequenceClassification fine-tuned by a plain loop, same recipe."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = BertForSequenceClassification.from_pretrained(hf_dir, num_labels=len(labels))
    index = {label: i for i, label in enumerate(labels)}
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")
             and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": rest, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.999))
    steps = math.ceil(epochs * len(train) / batch)
    warmup = int(0.1 * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (
        (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup))))
    order = random.Random(seed)
    model.train()
    start, step = time.perf_counter(), 0
    while step < steps:
        rows = train[:]
        order.shuffle(rows)
        for at in range(0, len(rows), batch):
            if step == steps:
                break
            chunk = rows[at:at + batch]
            inputs = tokenizer([t for _, t in chunk], padding=True, truncation=True,
                               max_length=model.config.max_position_embeddings,
                               return_tensors="pt")
            loss = model(**inputs, labels=torch.tensor([index[lab] for lab, _ in chunk])).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
    seconds = time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.inference_mode():
        for at in range(0, len(val), 64):
            chunk = val[at:at + 64]
            inputs = tokenizer([t for _, t in chunk], padding=True, truncation=True,
                               max_length=model.config.max_position_embeddings,
                               return_tensors="pt")
            predicted = model(**inputs).logits.argmax(-1).tolist()
            correct += sum(p == index[lab] for p, (lab, _) in zip(predicted, chunk))
    return {"accuracy": correct / len(val), "s_per_step": seconds / steps, "steps": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", type=Path, required=True, help="a local Hugging Face BERT folder")
    p.add_argument("--train", type=Path, required=True)
    p.add_argument("--val", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4000, help="training rows sampled from --train")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/finetune"))
    p.add_argument("--old-preset", action="store_true",
                   help="also pygpt with --preset bert-classify (the from-scratch preset)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(args.train)
    random.Random(0).shuffle(rows)
    train_rows, val_rows = rows[:args.rows], read_rows(args.val)
    labels = sorted({label for label, _ in train_rows})
    train = write_rows(args.out / "train.tsv", train_rows)
    val = write_rows(args.out / "val.tsv", val_rows)
    imported = args.out / "imported"
    if not (imported / "config.json").exists():
        subprocess.run([sys.executable, "-m", "pygpt.convert", "--from-hf", str(args.hf),
                        "--out", str(imported)], check=True)
    print(f"{len(train_rows)} training rows, {len(val_rows)} validation rows, labels {labels}; "
          f"recipe {FROM_PRETRAINED}; torch {torch.__version__}, {args.threads} thread(s)")
    sides = {"pygpt": lambda s: pygpt_run(imported, train, val, args.out / f"pygpt-{s}", s,
                                          args.threads, []),
             "transformers": lambda s: transformers_run(
                 args.hf, train_rows, val_rows, labels, s, args.threads,
                 FROM_PRETRAINED["epochs"], FROM_PRETRAINED["lr"],
                 FROM_PRETRAINED["batch_size"])}
    if args.old_preset:
        sides["pygpt --preset bert-classify"] = lambda s: pygpt_run(
            imported, train, val, args.out / f"pygpt-old-{s}", s, args.threads,
            ["--preset", "bert-classify"])
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for seed in args.seeds:
        for side, run in sides.items():
            result = run(seed)
            results[side].append(result)
            print(f"seed {seed} {side}: accuracy {result['accuracy']:.4f}, "
                  f"{result['s_per_step']:.3f} s/step over {result['steps']} steps"
                  + (f"\n    {result['settings']}" if "settings" in result else ""), flush=True)
    for side, runs in results.items():
        mean = sum(r["accuracy"] for r in runs) / len(runs)
        print(f"{side}: mean accuracy {mean:.4f} over seeds {args.seeds}; "
              f"{sum(r['s_per_step'] for r in runs) / len(runs):.3f} s/step")


if __name__ == "__main__":
    main()
