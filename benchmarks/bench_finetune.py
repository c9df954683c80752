"""Fine-tuning an imported pretrained encoder, pygpt's defaults against plain transformers code
running the same recipe on the same model, data and seeds: sentence classification (--task
classify, accuracy) or named-entity tagging (--task tag, entity-level micro F1 by conlleval's
exact-span rule).

    python benchmarks/bench_finetune.py --task classify --hf MODEL_DIR --train train.tsv \\
        --val dev.tsv --rows 4000 --seeds 1 2 --out runs/finetune-sst2
    python benchmarks/bench_finetune.py --task tag --hf MODEL_DIR --train train.conll \\
        --val valid.conll --rows 2000 --out runs/finetune-ner

MODEL_DIR is a local Hugging Face BERT folder (config.json, model.safetensors, vocab.txt).
Classification reads TSV files with a header, the label then the text in their first two
columns; tagging reads CoNLL files (pygpt_runtime.conll). The training set is a seeded sample of
--rows of --train (rows or sentences). For each seed:

- pygpt: `python -m pygpt.convert --from-hf MODEL_DIR` once, then `python -m pygpt.train --task
  TASK --init-from` it with nothing else (its defaults for a pretrained source: the preset
  bert-TASK-pretrained) and --val-data, scored on --val by pygpt.classify / pygpt.tag's own
  functions. With --old-preset, also the same with `--preset bert-TASK` (the from-scratch
  preset);
- transformers: BertForSequenceClassification / BertForTokenClassification from MODEL_DIR,
  fine-tuned by a plain PyTorch loop with the same recipe (AdamW lr, betas (0.9, 0.999), weight
  decay 0.01 off biases and norms, 10% linear warmup then linear decay to 0, batch 32, gradient
  norm clipped at 1, the same epochs; a word's label on its first piece), batches padded to their
  longest row, scored on --val by the same rule.

With --int8, pygpt's model is also exported (python -m pygpt.export --quantize int8) and its fp32
and int8 graphs scored on the torch-free runner. Both sides score the model of the last step (no choice of the best checkpoint on --val). Prints
each run's score and seconds per training step (the steps alone), then the mean per side.
Timings depend on what else the machine runs: run it on a quiet one.
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
from typing import Any, Callable

import torch

from pygpt.config.presets import FROM_PRETRAINED
from pygpt_runtime.conll import Sentence, read_conll, score


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


def write_conll(path: Path, sentences: list[Sentence]) -> Path:
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(s.words, s.tags)) + "\n"
                            for s in sentences), encoding="utf-8")
    return path


class Classify:
    """Sentence classification: its rows, pygpt's score, transformers' model, batch and score."""
    name, metric = "classify", "accuracy"

    def __init__(self, train: list, val: list):
        self.train, self.val = train, val
        self.labels = sorted({label for label, _ in train})

    @staticmethod
    def read(path: Path) -> list:
        return read_rows(path)

    def write(self, path: Path, rows: list) -> Path:
        return write_rows(path.with_suffix(".tsv"), rows)

    def pygpt_score(self, ckpt: Path, val: Path) -> float:
        from pygpt.classify import load_classifier, predict
        from pygpt.data.labelled import Encoded, read_labelled
        model, tokenizer, labels = load_classifier(str(ckpt))
        encoded = Encoded(read_labelled(val), labels, tokenizer, model.config.block_size, val)
        return float((predict(model, encoded).argmax(-1) == encoded.labels).float().mean())

    def onnx_score(self, runner, val: Path) -> float:
        probs = runner.classify([t for _, t in self.val])
        return sum(runner.labels[int(p.argmax())] == label
                   for p, (label, _) in zip(probs, self.val)) / len(self.val)

    def hf_model(self, hf_dir: Path):
        from transformers import BertForSequenceClassification
        return BertForSequenceClassification.from_pretrained(hf_dir, num_labels=len(self.labels))

    def hf_inputs(self, tokenizer, rows: list, most: int) -> tuple[dict, Any]:
        inputs = tokenizer([t for _, t in rows], padding=True, truncation=True, max_length=most,
                           return_tensors="pt")
        return inputs, torch.tensor([self.labels.index(label) for label, _ in rows])

    def hf_score(self, model, tokenizer, most: int) -> float:
        correct = 0
        for at in range(0, len(self.val), 64):
            chunk = self.val[at:at + 64]
            inputs, gold = self.hf_inputs(tokenizer, chunk, most)
            correct += int((model(**inputs).logits.argmax(-1) == gold).sum())
        return correct / len(self.val)


class Tag:
    """Entity tagging: CoNLL sentences; entity-level micro F1 (conlleval's rule) both sides."""
    name, metric = "tag", "entity F1"

    def __init__(self, train: list, val: list):
        self.train, self.val = train, val
        self.labels = sorted({t for s in train for t in s.tags})

    @staticmethod
    def read(path: Path) -> list:
        return read_conll(path).sentences

    def write(self, path: Path, rows: list) -> Path:
        return write_conll(path.with_suffix(".conll"), rows)

    def pygpt_score(self, ckpt: Path, val: Path) -> float:
        from pygpt.tag import encode, load_tagger
        from pygpt.tasks.tagging import predict_tags
        model, tokenizer, labels = load_tagger(str(ckpt))
        sentences = read_conll(val).sentences
        predicted = predict_tags(model, encode(sentences, model, tokenizer, labels, val), labels)
        return score([s.tags for s in sentences], predicted)["micro"].f1

    def onnx_score(self, runner, val: Path) -> float:
        return runner.score_conll(str(val))[1]["micro"].f1

    def hf_model(self, hf_dir: Path):
        from transformers import BertForTokenClassification
        return BertForTokenClassification.from_pretrained(hf_dir, num_labels=len(self.labels))

    def hf_inputs(self, tokenizer, rows: list, most: int) -> tuple[dict, Any]:
        inputs = tokenizer([list(s.words) for s in rows], is_split_into_words=True,
                           padding=True, truncation=True, max_length=most, return_tensors="pt")
        labels = torch.full(inputs["input_ids"].shape, -100)
        for b, s in enumerate(rows):
            seen = set()
            for i, word in enumerate(inputs.word_ids(b)):
                if word is not None and word not in seen:
                    seen.add(word)
                    labels[b, i] = self.labels.index(s.tags[word])
        return inputs, labels

    def hf_score(self, model, tokenizer, most: int) -> float:
        predicted = []
        for at in range(0, len(self.val), 64):
            chunk = self.val[at:at + 64]
            inputs, labels = self.hf_inputs(tokenizer, chunk, most)
            best = model(**inputs).logits.argmax(-1)
            for b, s in enumerate(chunk):
                tags = [self.labels[int(best[b, i])] for i in range(labels.shape[1])
                        if labels[b, i] != -100]
                predicted.append(tags + ["O"] * (len(s.words) - len(tags)))  # cut by max_length
        return score([s.tags for s in self.val], predicted)["micro"].f1


TASKS = {"classify": Classify, "tag": Tag}


def pygpt_run(task, imported: Path, train: Path, val: Path, out: Path, seed: int, threads: int,
              extra: list[str], int8: bool = False) -> dict:
    """pygpt's fine-tune of the imported model: its score and seconds a step (of the steps
    alone, as its log counts them); int8: also its ONNX export's scores, fp32 and int8."""
    command = [sys.executable, "-m", "pygpt.train", "--task", task.name, "--init-from",
               str(imported), "--data", str(train), "--val-data", str(val), "--out", str(out),
               "--seed", str(seed), "--threads", str(threads), "--json",
               "--eval-interval", "1000000", "--overwrite", *extra]  # one evaluation: the last
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    settings = next(line for line in done.stdout.splitlines() if "settings:" in line)
    last = json.loads(done.stdout.strip().splitlines()[-1])
    steps, seconds = last["step"], last["tokens"] / last["tokens_per_s"]
    torch.set_num_threads(threads)
    with torch.inference_mode():
        result = task.pygpt_score(out, val)
    run = {"score": result, "s_per_step": seconds / steps, "steps": steps,
           "settings": settings.strip()}
    if int8:  # the exported graphs' scores, fp32 and int8, on the torch-free runner
        from pygpt import export
        from pygpt_runtime.onnx_bert import OnnxBERT
        export.export(out, out / "onnx", quantize="int8")
        run["onnx"] = {variant: task.onnx_score(OnnxBERT(str(out / "onnx"), variant, threads),
                                                val) for variant in ("fp32", "int8")}
    return run


def transformers_run(task, hf_dir: Path, seed: int, threads: int) -> dict:
    """transformers' model of the task fine-tuned by a plain loop, the same recipe."""
    from transformers import AutoTokenizer

    epochs, lr, batch = (FROM_PRETRAINED[k] for k in ("epochs", "lr", "batch_size"))
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = task.hf_model(hf_dir)
    most = model.config.max_position_embeddings
    plain = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for p in model.parameters() if all(p is not q for q in plain)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": FROM_PRETRAINED[
                                        "weight_decay"]},
                                   {"params": plain, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, FROM_PRETRAINED["beta2"]))
    steps = math.ceil(epochs * len(task.train) / batch)
    warmup = int(FROM_PRETRAINED["warmup_frac"] * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (
        (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup))))
    order = random.Random(seed)
    model.train()
    start, step = time.perf_counter(), 0
    while step < steps:
        rows = task.train[:]
        order.shuffle(rows)
        for at in range(0, len(rows), batch):
            if step == steps:
                break
            inputs, labels = task.hf_inputs(tokenizer, rows[at:at + batch], most)
            loss = model(**inputs, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
    seconds = time.perf_counter() - start
    model.eval()
    with torch.inference_mode():
        result = task.hf_score(model, tokenizer, most)
    return {"score": result, "s_per_step": seconds / steps, "steps": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=list(TASKS), default="classify")
    p.add_argument("--hf", type=Path, required=True, help="a local Hugging Face BERT folder")
    p.add_argument("--train", type=Path, required=True)
    p.add_argument("--val", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4000,
                   help="training rows (sentences, for tag) sampled from --train")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/finetune"))
    p.add_argument("--int8", action="store_true",
                   help="also score pygpt's model exported to ONNX, fp32 and int8 graphs")
    p.add_argument("--old-preset", action="store_true",
                   help="also pygpt with --preset bert-TASK (the from-scratch preset)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kind = TASKS[args.task]
    rows = kind.read(args.train)
    random.Random(0).shuffle(rows)
    task = kind(rows[:args.rows], kind.read(args.val))
    train, val = task.write(args.out / "train", task.train), task.write(args.out / "val", task.val)
    imported = args.out / "imported"
    if not (imported / "config.json").exists():
        subprocess.run([sys.executable, "-m", "pygpt.convert", "--from-hf", str(args.hf),
                        "--out", str(imported)], check=True)
    print(f"{args.task}: {len(task.train)} training rows, {len(task.val)} validation rows, "
          f"{len(task.labels)} labels; recipe {FROM_PRETRAINED}; torch {torch.__version__}, "
          f"{args.threads} thread(s)")
    sides: dict[str, Callable[[int], dict]] = {
        "pygpt": lambda s: pygpt_run(task, imported, train, val, args.out / f"pygpt-{s}", s,
                                     args.threads, [], args.int8),
        "transformers": lambda s: transformers_run(task, args.hf, s, args.threads)}
    if args.old_preset:
        sides[f"pygpt --preset bert-{args.task}"] = lambda s: pygpt_run(
            task, imported, train, val, args.out / f"pygpt-old-{s}", s, args.threads,
            ["--preset", f"bert-{args.task}"])
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for seed in args.seeds:
        for side, run in sides.items():
            result = run(seed)
            results[side].append(result)
            print(f"seed {seed} {side}: {task.metric} {result['score']:.4f}, "
                  f"{result['s_per_step']:.3f} s/step over {result['steps']} steps"
                  + (f"\n    {result['settings']}" if "settings" in result else "")
                  + (f"\n    exported: fp32 {result['onnx']['fp32']:.4f}, int8 "
                     f"{result['onnx']['int8']:.4f}" if "onnx" in result else ""), flush=True)
    for side, runs in results.items():
        print(f"{side}: mean {task.metric} {sum(r['score'] for r in runs) / len(runs):.4f} over "
              f"seeds {args.seeds}; {sum(r['s_per_step'] for r in runs) / len(runs):.3f} s/step")


if __name__ == "__main__":
    main()
