"""`python -m pygpt.answer --ckpt runs/qa --question "Where does the Rhine rise?" --context
"The Rhine rises in the Swiss Alps."`: the answer a BERT question answerer (python -m pygpt.train
--task qa) finds in the context, its character span [start, end) there and its score (start +
end logit); or, with --data, its SQuAD exact match and F1 on a SQuAD v1.1 or v2.0 file. A
context longer than the model's window is read in overlapping windows, as in training."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pygpt.data.squad import EncodedQA
from pygpt.models import BERT
from pygpt.storage.checkpoint import load, load_labels
from pygpt.tasks.command import task_parser, task_run
from pygpt.tasks.qa import SPAN_LABELS, predict_answers
from pygpt.tokenizer import require_specials
from pygpt_runtime.answering import Prediction, answer_lines
from pygpt_runtime.cli_checks import utf8_text
from pygpt_runtime.squad import (Question, answers_scored, questions_of, read_squad, report,
                                 unanswerable)


def require_answerer(ckpt: str, model, tokenizer) -> None:
    """A ValueError unless the model loaded from ckpt (model, tokenizer) answers questions."""
    if (not isinstance(model, BERT) or model.config.pooling != "span"
            or load_labels(ckpt) != SPAN_LABELS):
        raise ValueError(f"{ckpt} holds no question answerer (a bert with pooling span); train "
                         "one with python -m pygpt.train --task qa")
    require_specials(tokenizer.special_tokens, tokenizer.encoding_needs, "questions")


def load_answerer(ckpt: str, kernels: str = "ext") -> tuple[BERT, object]:
    """(model, tokenizer) of a question answerer's checkpoint; a ValueError for any other."""
    model, tokenizer = load(ckpt, kernels=kernels)
    require_answerer(ckpt, model, tokenizer)
    return model, tokenizer


def answer(model: BERT, tokenizer, question: str, context: str, no_answer: bool = False,
           threshold: float = 0.0, where: str = "--question") -> Prediction:
    """The answer to question in context; no_answer: whether it may be none (v2.0). Errors
    name the question as where."""
    encoded = EncodedQA([Question("", question, context, ())], tokenizer,
                        model.config.block_size, where)
    return predict_answers(model, encoded, no_answer, threshold)[0]


def main(argv: Optional[list[str]] = None) -> None:
    p = task_parser("answer", __doc__, "a question answerer's checkpoint folder (python -m "
                                       "pygpt.train --task qa)", "rows")
    p.add_argument("--question", default=None, help="a question to answer from --context "
                                                    "(default: none; give it or --data)")
    p.add_argument("--context", default=None, help="the text that holds the answer")
    p.add_argument("--data", default=None, help="a SQuAD v1.1 or v2.0 JSON file to score the "
                                                "model on (default: none); its questions may "
                                                "go unanswered where it has unanswerable ones")
    p.add_argument("--no-answer", action="store_true",
                   help="--question may go unanswered (SQuAD v2.0): when the [CLS] score beats "
                        "the best span's by more than --null-threshold")
    p.add_argument("--null-threshold", type=float, default=0.0,
                   help="how far the [CLS] score must beat the best span's for no answer")
    args = p.parse_args(argv)
    with task_run(args):
        if (args.data is None) == (args.question is None):
            raise ValueError("give either --data (a SQuAD file) or --question and --context")
        if args.question is not None and args.context is None:
            raise ValueError("--question needs --context, the text that holds the answer")
        if args.data is not None and args.context is not None:
            raise ValueError("--context goes with --question; --data holds its contexts")
        if args.question is not None:
            utf8_text(args.question, "--question")
            utf8_text(args.context, "--context")
            if not args.question.strip():
                raise ValueError("--question is empty")
            if not args.context.strip():
                raise ValueError("--context is empty")
        model, tokenizer = load_answerer(args.ckpt, args.kernels)
        if args.question is not None:
            print("\n".join(answer_lines(answer(model, tokenizer, args.question, args.context,
                                                args.no_answer, args.null_threshold))))
        else:
            questions = questions_of(read_squad(args.data))
            encoded = EncodedQA(questions, tokenizer, model.config.block_size, Path(args.data))
            predicted = predict_answers(model, encoded, bool(unanswerable(questions)),
                                        args.null_threshold, args.batch_size)
            print(report(answers_scored(questions, predicted), len(questions)))


if __name__ == "__main__":
    main()
