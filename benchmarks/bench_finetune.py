"""Fine-tuning an imported pretrained encoder, pygpt's defaults against plain transformers code
running the same recipe on the same model, data and seeds: sentence classification (--task
classify, accuracy), named-entity tagging (--task tag, entity-level micro F1 by conlleval's
exact-span rule, and each type's) or extractive question answering (--task qa, SQuAD's F1 and
exact match, v2.0's unanswerable questions included).

    python benchmarks/bench_finetune.py --task classify --hf MODEL_DIR --train train.tsv \\
        --val dev.tsv --rows 4000 --seeds 1 2 --out runs/finetune-sst2
    python benchmarks/bench_finetune.py --task tag --hf MODEL_DIR --train train.conll \\
        --val valid.conll --rows 2000 --out runs/finetune-ner
    python benchmarks/bench_finetune.py --task qa --hf MODEL_DIR --train train.json \\
        --val dev.json --out runs/finetune-qa

MODEL_DIR is a local Hugging Face BERT folder (config.json, model.safetensors, vocab.txt).
Classification reads TSV files with a header, the label then the text in their first two
columns; tagging reads CoNLL files (pygpt_runtime.conll); question answering SQuAD v1.1 or v2.0
JSON (pygpt_runtime.squad). The training set is a seeded sample of --rows of --train (rows,
sentences or paragraphs with all their questions). For each seed:

- pygpt: `python -m pygpt.convert --from-hf MODEL_DIR` once, then `python -m pygpt.train --task
  TASK --init-from` it with nothing else (its defaults for a pretrained source: the preset
  bert-TASK-pretrained) and --val-data, scored on --val by pygpt.classify / pygpt.tag's own
  functions. With --old-preset, also the same with `--preset bert-TASK` (the from-scratch
  preset);
- transformers: BertForSequenceClassification / BertForTokenClassification /
  BertForQuestionAnswering from MODEL_DIR, fine-tuned by a plain PyTorch loop with the same
  recipe and model (no dropout of attention probabilities, as pygpt's BERT has none; AdamW lr,
  betas (0.9, 0.999), weight decay 0.01 off biases and norms, 10% linear warmup
  then linear decay to 0, batch 32, gradient norm clipped at 1, the same epochs; a word's label
  on its first piece; questions read as run_qa.py does, windows of 384 tokens with a stride of
  128, an answer not wholly in a window pointing at [CLS]), batches padded to their longest row,
  scored on --val by the same rule (an answer is the best start + end logit over a question's
  windows, at most MAX_ANSWER pieces, or none where [CLS] scores better in a v2.0 set).

With --int8, pygpt's model is also exported (python -m pygpt.export --quantize int8, and again
with --int8-per-tensor) and its fp32 and int8 graphs scored on the torch-free runner. Both sides
score the model of the last step (no choice of the best checkpoint on --val). Prints
each run's scores and seconds per training step (the steps alone), then the mean per side.
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
from typing import Any, Callable, Optional

import torch

from pygpt.config.presets import FROM_PRETRAINED
from pygpt_runtime.answering import MAX_ANSWER
from pygpt_runtime.conll import Sentence, read_conll, score
from pygpt_runtime.families import SPAN_LABELS
from pygpt_runtime.squad import (answers_scored, questions_of, read_squad, squad_scores,
                                 unanswerable)


# transformers' BERT drops attention probabilities in training (attention_probs_dropout_prob
# 0.1); pygpt's has only the hidden dropout, which its fused attention leaves out of the kernel.
# Off here, so that both sides train the same model.
SAME_MODEL = {"attention_probs_dropout_prob": 0.0}


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
    unit = "rows"

    def __init__(self, train: list, val: list):
        self.train, self.val = train, val
        self.labels = sorted({label for label, _ in train})

    @staticmethod
    def read(path: Path) -> list:
        return read_rows(path)

    def write(self, path: Path, rows: list) -> Path:
        return write_rows(path.with_suffix(".tsv"), rows)

    def pygpt_scores(self, ckpt: Path, val: Path) -> dict[str, float]:
        from pygpt.classify import load_classifier, predict
        from pygpt.data.labelled import Encoded, read_labelled
        model, tokenizer, labels = load_classifier(str(ckpt))
        encoded = Encoded(read_labelled(val), labels, tokenizer, model.config.block_size, val)
        return {"accuracy": float((predict(model, encoded).argmax(-1) == encoded.labels)
                                  .float().mean())}

    def onnx_scores(self, runner, val: Path) -> dict[str, float]:
        probs = runner.classify([t for _, t in self.val])
        return {"accuracy": sum(runner.labels[int(p.argmax())] == label
                                for p, (label, _) in zip(probs, self.val)) / len(self.val)}

    def hf_model(self, hf_dir: Path):
        from transformers import BertForSequenceClassification
        return BertForSequenceClassification.from_pretrained(hf_dir, num_labels=len(self.labels),
                                                             **SAME_MODEL)

    def hf_rows(self, tokenizer, most: int) -> list:
        return self.train

    def hf_batch(self, tokenizer, rows: list, most: int) -> dict[str, Any]:
        inputs = tokenizer([t for _, t in rows], padding=True, truncation=True,
                           max_length=most, return_tensors="pt")
        return {**inputs, "labels": torch.tensor([self.labels.index(label)
                                                  for label, _ in rows])}

    def hf_scores(self, model, tokenizer, most: int) -> dict[str, float]:
        correct = 0
        for at in range(0, len(self.val), 64):
            inputs = self.hf_batch(tokenizer, self.val[at:at + 64], most)
            gold = inputs.pop("labels")
            correct += int((model(**inputs).logits.argmax(-1) == gold).sum())
        return {"accuracy": correct / len(self.val)}


class Tag:
    """Entity tagging: CoNLL sentences; entity-level F1 (conlleval's rule), micro-averaged as
    the metric and each type's, both sides."""
    name, metric = "tag", "f1"
    unit = "sentences"

    def __init__(self, train: list, val: list):
        self.train, self.val = train, val
        self.labels = sorted({t for s in train for t in s.tags})

    @staticmethod
    def read(path: Path) -> list:
        return read_conll(path).sentences

    def write(self, path: Path, rows: list) -> Path:
        return write_conll(path.with_suffix(".conll"), rows)

    @staticmethod
    def by_type(scores: dict) -> dict[str, float]:
        return {"f1": scores["micro"].f1,
                **{kind: s.f1 for kind, s in sorted(scores.items()) if kind != "micro"}}

    def pygpt_scores(self, ckpt: Path, val: Path) -> dict[str, float]:
        from pygpt.tag import encode, load_tagger
        from pygpt.tasks.tagging import predict_tags
        model, tokenizer, labels = load_tagger(str(ckpt))
        sentences = read_conll(val).sentences
        predicted = predict_tags(model, encode(sentences, model, tokenizer, labels, val), labels)
        return self.by_type(score([s.tags for s in sentences], predicted))

    def onnx_scores(self, runner, val: Path) -> dict[str, float]:
        return self.by_type(runner.score_conll(str(val))[1])

    def hf_model(self, hf_dir: Path):
        from transformers import BertForTokenClassification
        return BertForTokenClassification.from_pretrained(hf_dir, num_labels=len(self.labels),
                                                          **SAME_MODEL)

    def hf_rows(self, tokenizer, most: int) -> list:
        return self.train

    def hf_batch(self, tokenizer, rows: list, most: int) -> dict[str, Any]:
        inputs = tokenizer([list(s.words) for s in rows], is_split_into_words=True,
                           padding=True, truncation=True, max_length=most, return_tensors="pt")
        labels = torch.full(inputs["input_ids"].shape, -100)
        for b, s in enumerate(rows):
            seen = set()
            for i, word in enumerate(inputs.word_ids(b)):
                if word is not None and word not in seen:
                    seen.add(word)
                    labels[b, i] = self.labels.index(s.tags[word])
        return {**inputs, "labels": labels}

    def hf_scores(self, model, tokenizer, most: int) -> dict[str, float]:
        predicted = []
        for at in range(0, len(self.val), 64):
            chunk = self.val[at:at + 64]
            inputs = self.hf_batch(tokenizer, chunk, most)
            labels = inputs.pop("labels")
            best = model(**inputs).logits.argmax(-1)
            for b, s in enumerate(chunk):
                tags = [self.labels[int(best[b, i])] for i in range(labels.shape[1])
                        if labels[b, i] != -100]
                predicted.append(tags + ["O"] * (len(s.words) - len(tags)))  # cut by max_length
        return self.by_type(score([s.tags for s in self.val], predicted))


class Answer:
    """Extractive question answering: SQuAD paragraphs with their questions; SQuAD's F1 as the
    metric, exact match and (for a v2.0 set) each kind's beside it. transformers' side reads
    the questions as run_qa.py does: question and context windows of WINDOW tokens overlapping
    by STRIDE, each with its tokens' character offsets."""
    name, metric = "qa", "f1"
    unit = "paragraphs"
    WINDOW, STRIDE = 384, 128

    def __init__(self, train: list, val: list):
        self.train, self.val = train, val
        self.questions = questions_of(val)
        self.labels = SPAN_LABELS
        self.no_answer = bool(unanswerable(questions_of(train)) or unanswerable(self.questions))

    @staticmethod
    def read(path: Path) -> list:
        return read_squad(path)

    def write(self, path: Path, rows: list) -> Path:
        path = path.with_suffix(".json")
        path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "sample", "paragraphs": [
            {"context": p.context, "qas": [
                {"id": q.id, "question": q.question, "is_impossible": not q.answers,
                 "answers": [{"text": a.text, "answer_start": a.start} for a in q.answers]}
                for q in p.questions]} for p in rows]}]}), encoding="utf-8")
        return path

    def pygpt_scores(self, ckpt: Path, val: Path) -> dict[str, float]:
        from pygpt.answer import load_answerer
        from pygpt.data.squad import EncodedQA
        from pygpt.tasks.qa import predict_answers
        model, tokenizer = load_answerer(str(ckpt))
        encoded = EncodedQA(self.questions, tokenizer, model.config.block_size, val)
        return answers_scored(self.questions, predict_answers(model, encoded, self.no_answer))

    def onnx_scores(self, runner, val: Path) -> dict[str, float]:
        return runner.score_squad(str(val), 0.0)[1]

    def hf_model(self, hf_dir: Path):
        from transformers import BertForQuestionAnswering
        return BertForQuestionAnswering.from_pretrained(hf_dir, **SAME_MODEL)

    def windows(self, tokenizer, questions: list) -> tuple[Any, list[tuple]]:
        """The questions' windows (tokenizer output with offsets and each window's question)
        and each window as a row for hf_batch: its token ids, segment ids and answer tokens,
        (0, 0) where it does not hold all of the answer."""
        found = tokenizer([q.question for q in questions], [q.context for q in questions],
                          truncation="only_second", max_length=self.WINDOW, stride=self.STRIDE,
                          return_overflowing_tokens=True, return_offsets_mapping=True)
        rows = []
        for w, n in enumerate(found["overflow_to_sample_mapping"]):
            answers, span = questions[n].answers, (0, 0)
            if answers:
                start, end = answers[0].start, answers[0].start + len(answers[0].text)
                context = [i for i, s in enumerate(found.sequence_ids(w)) if s == 1]
                offsets = found["offset_mapping"][w]
                if offsets[context[0]][0] <= start and end <= offsets[context[-1]][1]:
                    first = next(i for i in context if offsets[i][1] > start)
                    last = max(i for i in context if offsets[i][0] < end)
                    span = (first, last)
            rows.append((found["input_ids"][w], found["token_type_ids"][w], span))
        return found, rows

    def hf_rows(self, tokenizer, most: int) -> list:
        return self.windows(tokenizer, questions_of(self.train))[1]

    def hf_batch(self, tokenizer, rows: list, most: int) -> dict[str, Any]:
        longest = max(len(ids) for ids, _, _ in rows)
        ids = torch.full((len(rows), longest), tokenizer.pad_token_id)
        types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for b, (row, segments, _) in enumerate(rows):
            ids[b, :len(row)], types[b, :len(row)], mask[b, :len(row)] = (
                torch.tensor(row), torch.tensor(segments), 1)
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
                "start_positions": torch.tensor([span[0] for _, _, span in rows]),
                "end_positions": torch.tensor([span[1] for _, _, span in rows])}

    def hf_scores(self, model, tokenizer, most: int) -> dict[str, float]:
        found, rows = self.windows(tokenizer, self.questions)
        logits = []
        for at in range(0, len(rows), 64):
            batch = self.hf_batch(tokenizer, rows[at:at + 64], most)
            out = model(**{k: v for k, v in batch.items() if not k.endswith("_positions")})
            logits += list(zip(out.start_logits.numpy(), out.end_logits.numpy()))
        best: dict[int, tuple[float, str]] = {}
        null: dict[int, float] = {}
        for w, n in enumerate(found["overflow_to_sample_mapping"]):
            start, end = logits[w]
            null[n] = min(null.get(n, float("inf")), float(start[0] + end[0]))
            context = [i for i, s in enumerate(found.sequence_ids(w)) if s == 1]
            offsets = found["offset_mapping"][w]
            for i in context:
                for j in context:
                    if i <= j < i + MAX_ANSWER and start[i] + end[j] > best.get(n, (-1e30,))[0]:
                        best[n] = (float(start[i] + end[j]), self.questions[n].context[
                            offsets[i][0]:offsets[j][1]])
        return squad_scores([[a.text for a in q.answers] for q in self.questions],
                            ["" if self.no_answer and null[n] > best[n][0] else best[n][1]
                             for n in range(len(self.questions))])


TASKS = {"classify": Classify, "tag": Tag, "qa": Answer}


def shown(scores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.4f}" for name, value in scores.items())


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
        result = task.pygpt_scores(out, val)
    run = {"scores": result, "s_per_step": seconds / steps, "steps": steps,
           "settings": settings.strip()}
    if int8:  # the exported graphs' scores on the torch-free runner: fp32, int8 as exported by
        # default (a scale per output channel) and with one scale per weight tensor
        from pygpt import export
        from pygpt.onnx.int8 import Int8Settings
        from pygpt_runtime.onnx_bert import OnnxBERT
        export.export(out, out / "onnx", quantize="int8")
        export.export(out, out / "onnx-per-tensor", quantize="int8",
                      int8=Int8Settings(per_channel=False))
        run["onnx"] = {name: task.onnx_scores(OnnxBERT(str(out / folder), variant, threads), val)
                       for name, folder, variant in (("fp32", "onnx", "fp32"),
                                                     ("int8", "onnx", "int8"),
                                                     ("int8 per tensor", "onnx-per-tensor",
                                                      "int8"))}
    return run


def transformers_run(task, hf_dir: Path, seed: int, threads: int,
                     max_steps: Optional[int] = None) -> dict:
    """transformers' model of the task fine-tuned by a plain loop, the same recipe (max_steps:
    that many steps instead of the recipe's epochs, as pygpt.train's --max-iters)."""
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
    train = task.hf_rows(tokenizer, most)
    steps = max_steps or math.ceil(epochs * len(train) / batch)
    warmup = int(FROM_PRETRAINED["warmup_frac"] * steps)
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
            loss = model(**task.hf_batch(tokenizer, rows[at:at + batch], most)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
    seconds = time.perf_counter() - start
    model.eval()
    with torch.inference_mode():
        result = task.hf_scores(model, tokenizer, most)
    return {"scores": result, "s_per_step": seconds / steps, "steps": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=list(TASKS), default="classify")
    p.add_argument("--hf", type=Path, required=True, help="a local Hugging Face BERT folder")
    p.add_argument("--train", type=Path, required=True)
    p.add_argument("--val", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4000,
                   help="training rows (sentences for tag, paragraphs for qa) sampled from "
                        "--train")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/finetune"))
    p.add_argument("--int8", action="store_true",
                   help="also score pygpt's model exported to ONNX, fp32 and int8 graphs")
    p.add_argument("--sides", nargs="+", choices=["pygpt", "transformers"],
                   default=["pygpt", "transformers"],
                   help="which sides to run (two processes, one a side, load the machine alike)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop both sides after this many steps (--max-iters for pygpt), to time "
                        "steps; the scores are then not the recipe's")
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
    print(f"{args.task}: {len(task.train)} training {task.unit}, {len(task.val)} validation "
          f"{task.unit}, "
          f"{len(task.labels)} labels; recipe {FROM_PRETRAINED}; torch {torch.__version__}, "
          f"{args.threads} thread(s)")
    steps = ["--max-iters", str(args.max_steps)] if args.max_steps else []
    sides: dict[str, Callable[[int], dict]] = {
        "pygpt": lambda s: pygpt_run(task, imported, train, val, args.out / f"pygpt-{s}", s,
                                     args.threads, steps, args.int8),
        "transformers": lambda s: transformers_run(task, args.hf, s, args.threads,
                                                   args.max_steps)}
    sides = {side: run for side, run in sides.items() if side in args.sides}
    if args.old_preset:
        sides[f"pygpt --preset bert-{args.task}"] = lambda s: pygpt_run(
            task, imported, train, val, args.out / f"pygpt-old-{s}", s, args.threads,
            ["--preset", f"bert-{args.task}", *steps])
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for seed in args.seeds:
        for side, run in sides.items():
            result = run(seed)
            results[side].append(result)
            print(f"seed {seed} {side}: {shown(result['scores'])}; "
                  f"{result['s_per_step']:.3f} s/step over {result['steps']} steps"
                  + (f"\n    {result['settings']}" if "settings" in result else "")
                  + "".join(f"\n    exported, {variant}: {shown(scores)}"
                            for variant, scores in result.get("onnx", {}).items()), flush=True)
    for side, runs in results.items():
        mean = sum(r["scores"][task.metric] for r in runs) / len(runs)
        print(f"{side}: mean {task.metric} {mean:.4f} over seeds {args.seeds}; "
              f"{sum(r['s_per_step'] for r in runs) / len(runs):.3f} s/step")


if __name__ == "__main__":
    main()
