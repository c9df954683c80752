"""`python -m pygpt.classify --ckpt runs/cls --data test.tsv`: a fine-tuned BERT classifier's
accuracy, macro-F1 and confusion table (rows: true label, columns: predicted) on labelled data;
or, with --text (and --text-pair), the label of one text and the probability of each label."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch

from pygpt.storage.checkpoint import load, load_labels
from pygpt.data.labelled import Encoded, Example, counts, macro_f1, read_labelled
from pygpt.decoding.finite import require_finite
from pygpt.models import BERT
from pygpt.tasks import TOKEN_HEADS
from pygpt.tasks.command import task_parser, task_run
from pygpt.tokenizer import require_specials
from pygpt_runtime.cli_checks import utf8_text


def classifier_labels(ckpt: str, model: torch.nn.Module, tokenizer) -> list[str]:
    """The labels of the classifier loaded from ckpt (model, tokenizer); a ValueError for any
    other model (an entity tagger's or a question answerer's labels are per token: pygpt.tag
    and pygpt.answer read them)."""
    labels = load_labels(ckpt)
    if not isinstance(model, BERT) or labels is None:
        raise ValueError(f"{ckpt} holds a {model.config.arch} model without a classification "
                         "head; train one with python -m pygpt.train --task classify")
    head = TOKEN_HEADS.get(model.config.pooling)
    if head is not None:
        raise ValueError(f"{ckpt} holds {head.what} (a head per token), not a classifier; use "
                         f"python -m {head.command}")
    require_specials(tokenizer.special_tokens, tokenizer.encoding_needs, "texts to classify")
    return labels


def load_classifier(ckpt: str, kernels: str = "ext") -> tuple[BERT, object, list[str]]:
    """(model, tokenizer, labels) of a classifier checkpoint; a ValueError for any other."""
    model, tokenizer = load(ckpt, kernels=kernels)
    return model, tokenizer, classifier_labels(ckpt, model, tokenizer)


@torch.inference_mode()
def predict(model: BERT, encoded: Encoded, batch_size: int = 64) -> torch.Tensor:
    """The class probabilities (n, num_labels) of every encoded example, in order."""
    return torch.cat([require_finite(model(**batch._replace(labels=None)._asdict()).logits)
                      .float().softmax(-1) for batch in encoded.in_order(batch_size)])


def classify_texts(model: BERT, tokenizer, labels: Sequence[str], texts: Sequence[str],
                   pairs: Optional[Sequence[str]] = None, source: str = "--text") -> torch.Tensor:
    """The class probabilities (n, num_labels) of texts (each with its pair from pairs), each
    cut to the model's positions as in training; errors name source."""
    examples = [Example(text, None if pairs is None else pairs[n], labels[0], n + 1)
                for n, text in enumerate(texts)]
    return predict(model, Encoded(examples, labels, tokenizer, model.config.block_size, source))


def confusion(predicted: torch.Tensor, true: torch.Tensor, num_labels: int) -> torch.Tensor:
    """(num_labels, num_labels) counts: row = true class, column = predicted."""
    return torch.bincount(true * num_labels + predicted,
                          minlength=num_labels ** 2).view(num_labels, num_labels)


def report(predicted: torch.Tensor, true: torch.Tensor, labels: Sequence[str]) -> str:
    """The accuracy line, the macro-F1 line and the confusion table."""
    n = len(true)
    correct = int((predicted == true).sum())
    lines = [f"accuracy {correct / n:.4f} ({correct}/{n})",
             f"macro-F1 {macro_f1(*(c.tolist() for c in counts(predicted, true, len(labels)))):.4f}",
             "", "confusion (rows: true label, columns: predicted)"]
    table = confusion(predicted, true, len(labels)).tolist()
    width = max(len(str(x)) for x in [*labels, "true \\ predicted", *sum(table, [])])
    lines.append(" ".join(s.rjust(width) for s in ["true \\ predicted", *labels]))
    lines += [" ".join(s.rjust(width) for s in [label, *map(str, row)])
              for label, row in zip(labels, table)]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    p = task_parser("classify", __doc__, "a classifier checkpoint folder (python -m "
                                         "pygpt.train --task classify)", "examples")
    p.add_argument("--data", default=None, help="labelled TSV or CSV (label and text columns, "
                                                "optionally text_pair) to score the model on "
                                                "(default: none; give --data or --text)")
    p.add_argument("--text", default=None,
                   help="one text to classify (default: none; instead of --data)")
    p.add_argument("--text-pair", default=None, help="with --text: its second text, for a model "
                                                     "fine-tuned on pairs (default: none)")
    args = p.parse_args(argv)
    with task_run(args):
        if (args.data is None) == (args.text is None):
            raise ValueError("give either --data (a labelled file) or --text")
        if args.text_pair is not None and args.text is None:
            raise ValueError("--text-pair goes with --text")
        for flag, text in (("--text", args.text), ("--text-pair", args.text_pair)):
            if text is not None:
                utf8_text(text, flag)
        model, tokenizer, labels = load_classifier(args.ckpt, args.kernels)
        if args.text is not None:
            if not args.text.strip() or (args.text_pair is not None
                                         and not args.text_pair.strip()):
                raise ValueError("--text and --text-pair must not be empty")
            pairs = None if args.text_pair is None else [args.text_pair]
            probs = classify_texts(model, tokenizer, labels, [args.text], pairs)[0]
            print(labels[int(probs.argmax())])
            for label, prob in sorted(zip(labels, probs.tolist()), key=lambda lp: -lp[1]):
                print(f"  {label}: {prob:.4f}")
        else:
            encoded = Encoded(read_labelled(args.data), labels, tokenizer,
                              model.config.block_size, Path(args.data))
            predicted = predict(model, encoded, args.batch_size).argmax(-1)
            print(report(predicted, encoded.labels, labels))


if __name__ == "__main__":
    main()
