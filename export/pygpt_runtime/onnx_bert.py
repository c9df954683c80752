"""Fill-mask, classification, entity tagging and question answering with a BERT exported by
`python -m pygpt.export`, with numpy and onnxruntime only (the deployment side, beside
run_onnx.py, whose command line pygpt-run hands to `main` here for an export whose runner.json
says "family": "bert"). Rows are built exactly as pygpt builds them: [CLS] text [SEP] for
fill-mask (the text's "[MASK]"s are mask tokens); for a classifier [CLS] text [SEP] (text_pair
[SEP]), the longer text cut from its end until the row fits; for a tagger the text's words in
rows of [CLS] pieces [SEP] (tagging.py); for an answerer [CLS] question [SEP] context-window
[SEP] (answering.py), whose row-building and span search pygpt shares."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import numpy as np

from pygpt_runtime.answering import (Pieces, Prediction, QARow, answer_lines, best_span,
                                     context_pieces, question_rows)
from pygpt_runtime.cli_checks import check_threads, exits_cleanly, utf8_text
from pygpt_runtime.conll import EntityScore, Tagged, file_report, read_conll, score
from pygpt_runtime.onnx_text import open_export, run_graph
from pygpt_runtime.run_onnx import parser
from pygpt_runtime.squad import Question, answers_scored, questions_of, read_squad, report
from pygpt_runtime.squad import unanswerable
from pygpt_runtime.tagging import WordRow, entity_lines, overlap_for, text_entities, word_rows
from pygpt_runtime.text import word_spans
from pygpt_runtime.windows import best_windows

MASK = "[MASK]"


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """The lengths of A and B once the longer (B on a tie) has lost its last token until the
    two fit budget, as pygpt.data.common.truncate_pair."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


class OnnxBERT:
    """One onnxruntime session over an exported BERT folder."""

    def __init__(self, folder: str, variant: str = "fp32", threads: Optional[int] = None):
        self.folder = Path(folder)
        self.config, self.session, self.tokenizer = open_export(
            self.folder, variant, threads, "bert",
            "; fill-mask, classification, tagging and answering need a bert export")
        self.task, self.labels = self.config["task"], self.config.get("labels")
        self.specials = self.tokenizer.special_tokens
        needed = ["[PAD]", "[CLS]", "[SEP]", *([MASK] if self.task == "fill-mask" else []),
                  *(["[UNK]"] if self.task in ("tag", "qa") else [])]
        missing = [name for name in needed if name not in self.specials]
        if missing:
            raise ValueError(f"{self.folder}: the tokenizer has no {', '.join(missing)}: "
                             "export again")

    def logits(self, rows: list[list[int]], firsts: Optional[list[int]] = None) -> np.ndarray:
        """The logits of token rows, right-padded into one batch; firsts[i]: where row i's
        segment B starts (None: no segment B)."""
        lengths = [len(r) for r in rows]
        ids = np.full((len(rows), max(lengths)), self.specials["[PAD]"], dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for b, row in enumerate(rows):
            ids[b, :len(row)], mask[b, :len(row)] = row, 1
            types[b, (firsts[b] if firsts else len(row)):len(row)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        logits = run_graph(self.session, feeds)[0]
        if self.labels is not None and logits.shape[-1] != len(self.labels):
            raise ValueError(f"{self.folder}: runner.json names {len(self.labels)} labels but "
                             f"the model gives {logits.shape[-1]} classes: export again")
        return logits

    def row_logits(self, rows: list[list[int]], firsts: Optional[list[int]] = None,
                   batch_size: int = 64) -> list[np.ndarray]:
        """Each row's logits (rows padded to the longest of its batch), batch_size rows a graph
        call (as pygpt's commands batch them); firsts as logits takes them."""
        return [row for start in range(0, len(rows), batch_size)
                for row in self.logits(rows[start:start + batch_size],
                                       firsts[start:start + batch_size] if firsts else None)]

    def _require(self, task: str, what: str) -> None:
        """A ValueError unless the export's task is task (what: its model, in words)."""
        if self.task != task:
            raise ValueError(f"{self.folder} holds a {self.task} model, not {what}")

    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """For each [MASK] in text, in order, the top_k (token, probability) pairs."""
        if self.task != "fill-mask":
            raise ValueError(f"{self.folder} holds a classifier; it has no masked-LM head")
        sp = self.specials
        ids = [sp["[CLS]"], *self.tokenizer.encode(text, parse_specials=True), sp["[SEP]"]]
        if len(ids) > self.config["block_size"]:
            raise ValueError(f"the text is {len(ids)} tokens with [CLS] and [SEP]; the model "
                             f"takes at most {self.config['block_size']}")
        at = [i for i, t in enumerate(ids) if t == sp[MASK]]
        if not at:
            raise ValueError(f"the text has no {MASK} to fill")
        probs = softmax(self.logits([ids])[0, at])
        best = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
        return [[(self.tokenizer.decode([int(i)]), float(p[i])) for i in row]
                for p, row in zip(probs, best)]

    def classify(self, texts: list[str], pairs: Optional[list[str]] = None) -> np.ndarray:
        """The class probabilities (n, num_labels) of texts (with their pairs)."""
        if self.task != "classify":
            raise ValueError(f"{self.folder} holds a pretrained model without a classification "
                             "head; use --text with a [MASK] to fill")
        sp, block = self.specials, self.config["block_size"]
        rows, firsts = [], []
        for n, text in enumerate(texts):
            a = self.tokenizer.encode(text)
            if pairs is None:
                rows.append([sp["[CLS]"], *a[:block - 2], sp["[SEP]"]])
                firsts.append(len(rows[-1]))
            else:
                b = self.tokenizer.encode(pairs[n])
                len_a, len_b = truncate_pair(len(a), len(b), block - 3)
                rows.append([sp["[CLS]"], *a[:len_a], sp["[SEP]"], *b[:len_b], sp["[SEP]"]])
                firsts.append(len_a + 2)
        return softmax(self.logits(rows, firsts))

    def word_tags(self, sentences: list[list[str]], source: str, lines: list[int],
                  batch_size: int = 64) -> list[list[str]]:
        """The tags of each sentence's words, in order, as pygpt.tasks.tagging's predict_tags
        gives them (each word's from the row that reads it best); a ValueError that names
        source and the sentence's line (lines) for a word the tokenizer cannot take."""
        sp, block = self.specials, self.config["block_size"]
        rows: list[list[WordRow]] = []
        for words, line in zip(sentences, lines):
            try:
                pieces = [self.tokenizer.encode(word) or [sp["[UNK]"]] for word in words]
                rows.append(word_rows(pieces, sp["[CLS]"], sp["[SEP]"], block,
                                      overlap_for(block)))
            except ValueError as e:
                raise ValueError(f"{source}, line {line}: {e}") from None
        flat = [row for sentence in rows for row in sentence]
        best = [row.argmax(-1) for row in self.row_logits([row.ids for row in flat],
                                                          batch_size=batch_size)]
        tags, at = [], 0
        for words, sentence in zip(sentences, rows):
            tags.append([self.labels[int(best[at + r][p])]
                         for r, p in best_windows(sentence, len(words))])
            at += len(sentence)
        return tags

    def tag(self, text: str, where: str = "--text") -> list[tuple[str, int, int]]:
        """The entities of text, in order: (type, start, end), [start, end) its characters, as
        pygpt.tag's tag_text finds them (errors name the text as where)."""
        self._require("tag", "an entity tagger")
        spans = word_spans(text)
        if not spans:
            raise ValueError(f"{where} holds no words")
        tags = self.word_tags([[text[start:end] for start, end in spans]], where, [1])[0]
        return text_entities(tags, spans)

    def score_conll(self, path: str) -> tuple[Tagged, dict[str, EntityScore]]:
        """A CoNLL file and the tagger's entity scores on it, as python -m pygpt.tag --data
        reads and scores it (a file with tags the model lacks is refused)."""
        self._require("tag", "an entity tagger")
        tagged = read_conll(path)
        for s in tagged.sentences:
            unknown = sorted(set(s.tags) - set(self.labels))
            if unknown:
                raise ValueError(f"{path}, line {s.line}: tags {', '.join(unknown)} are not the "
                                 f"model's ({', '.join(self.labels)})")
        predicted = self.word_tags([list(s.words) for s in tagged.sentences], path,
                                   [s.line for s in tagged.sentences])
        return tagged, score([s.tags for s in tagged.sentences], predicted)

    def answers(self, asked: list[tuple[str, str]], no_answer: bool, threshold: float,
                wheres: list[str], batch_size: int = 64) -> list[Prediction]:
        """The answer to each (question, context) of asked, in order, as pygpt.tasks.qa's
        predict_answers gives them; no_answer: whether one may be none (when [CLS] beats the
        best span by more than threshold). A ValueError naming the question's `wheres` entry
        for a question that leaves no room for its context."""
        self._require("qa", "a question answerer")
        sp = self.specials
        by_context: dict[str, Pieces] = {}
        questions: list[tuple[Pieces, list[QARow]]] = []
        for (question, context), where in zip(asked, wheres):
            try:
                if context not in by_context:
                    by_context[context] = context_pieces(context, self.tokenizer, sp["[UNK]"])
                pieces = by_context[context]
                questions.append((pieces, question_rows(
                    self.tokenizer.encode(question), pieces.ids, None, sp["[CLS]"],
                    sp["[SEP]"], self.config["block_size"])))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        flat = [row for _, rows in questions for row in rows]
        logits = self.row_logits([row.ids for row in flat], [row.firsts[0] for row in flat],
                                 batch_size)
        found, at = [], 0
        for (_, context), (pieces, rows) in zip(asked, questions):
            found.append(best_span(context, pieces, rows, logits[at:at + len(rows)], no_answer,
                                   threshold))
            at += len(rows)
        return found

    def answer(self, question: str, context: str, no_answer: bool = False,
               threshold: float = 0.0, where: str = "--question") -> Prediction:
        """The answer to one question in context, as pygpt.answer's answer gives it (errors
        name the question as where)."""
        return self.answers([(question, context)], no_answer, threshold, [where])[0]

    def score_squad(self, path: str, threshold: float) -> tuple[list[Question], dict[str, float]]:
        """A SQuAD file's questions and the answerer's scores on them, as python -m pygpt.answer
        --data reads and scores it (answers may be none where the file has unanswerable
        questions)."""
        questions = questions_of(read_squad(path))
        found = self.answers([(q.question, q.context) for q in questions],
                             bool(unanswerable(questions)), threshold,
                             [f"{path}, question {q.id!r}" for q in questions])
        return questions, answers_scored(questions, found)


def main(argv: Optional[list[str]] = None) -> None:
    """pygpt-run for a bert export (run_onnx's command line)."""
    args = parser().parse_args(argv)
    with exits_cleanly():
        run_bert(args, "int8" if args.int8 else "fp32")


def run_bert(args: argparse.Namespace, variant: str) -> None:
    """Runs the export's task on the command line's texts and prints what pygpt's command of
    that task prints: python -m pygpt.fill_mask / pygpt.classify / pygpt.tag --text, or
    python -m pygpt.answer --question --context."""
    try:
        check_threads(args.threads)
        for flag, text in (("--text", args.text), ("--text-pair", args.text_pair),
                           ("--question", args.question), ("--context", args.context)):
            if text is not None:
                utf8_text(text, flag)
        model = OnnxBERT(args.model, variant, args.threads)
        _check_flags(args, model.task)
        if model.task == "fill-mask":
            top_k = 5 if args.top_k is None else args.top_k
            if top_k < 1:
                raise ValueError("--top-k must be at least 1")
            lines = [f"{MASK} {n}: " + ", ".join(f"{token!r} {prob:.3f}" for token, prob in fills)
                     for n, fills in enumerate(model.fill_mask(args.text, top_k), start=1)]
        elif model.task == "classify":
            if not args.text.strip() or (args.text_pair is not None and not args.text_pair.strip()):
                raise ValueError("--text and --text-pair must not be empty")
            pairs = None if args.text_pair is None else [args.text_pair]
            probs = model.classify([args.text], pairs)[0]
            lines = [model.labels[int(probs.argmax())],
                     *(f"  {label}: {prob:.4f}" for label, prob in
                       sorted(zip(model.labels, probs.tolist()), key=lambda lp: -lp[1]))]
        elif model.task == "tag" and args.data is not None:
            lines = [file_report(*model.score_conll(args.data))]
        elif model.task == "tag":
            lines = entity_lines(args.text, model.tag(args.text))
        elif args.data is not None:
            questions, scores = model.score_squad(args.data, args.null_threshold)
            lines = [report(scores, len(questions))]
        else:
            lines = answer_lines(model.answer(args.question, args.context, args.no_answer,
                                              args.null_threshold))
    except (ValueError, OSError, ImportError) as e:
        raise SystemExit(f"error: {e}") from None
    print("\n".join(lines))


def _check_flags(args: argparse.Namespace, task: str) -> None:
    """A ValueError unless the command line gives what a bert export of task takes: --text
    (and, for a classifier, --text-pair; for a tagger, or --data), or an answerer's --question
    and --context (or --data)."""
    if task == "qa":
        if args.text is not None or (args.data is None) == (args.question is None):
            raise ValueError("a question answerer's export takes either --data (a SQuAD file) "
                             "or --question and --context")
        if args.data is not None:
            if args.context is not None:
                raise ValueError("--context goes with --question; --data holds its contexts")
            return
        if args.context is None:
            raise ValueError("--question needs --context, the text that holds the answer")
        if not args.question.strip():
            raise ValueError("--question is empty")
        if not args.context.strip():
            raise ValueError("--context is empty")
        return
    if task == "tag" and (args.text is None) == (args.data is None):
        raise ValueError("an entity tagger's export takes either --data (a CoNLL file) or "
                         "--text")
    if args.data is not None and task != "tag":
        raise ValueError("--data is for an entity tagger's or a question answerer's export")
    if args.text is None and task != "tag":
        raise ValueError("a bert export takes --text (not --prompt)")
    if args.question is not None or args.context is not None:
        raise ValueError("--question and --context are for a question answerer's export")
    if args.text_pair is not None and task != "classify":
        raise ValueError("--text-pair is for a classifier")
    if args.no_answer or args.null_threshold != 0.0:
        raise ValueError("--no-answer and --null-threshold are for a question answerer's export")
