"""`python -m pygpt.tag --ckpt runs/ner --text "Peter Blackburn flew to Brussels"`: the named
entities a BERT tagger (python -m pygpt.train --task tag) finds in a text, one a line with its
type and character span [start, end) in the text; or, with --data, its entity-level precision,
recall and F1 per type and micro-averaged on a CoNLL file (conlleval's exact-span rule)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from pygpt.data.conll import EncodedTags
from pygpt.models import BERT
from pygpt.storage.checkpoint import load, load_labels
from pygpt.tasks.command import task_parser, task_run
from pygpt.tasks.tagging import predict_tags
from pygpt.tokenizer import require_specials
from pygpt_runtime.cli_checks import utf8_text
from pygpt_runtime.conll import Sentence, file_report, read_conll, score
from pygpt_runtime.tagging import OUTSIDE, entity_lines, overlap_for, text_entities
from pygpt_runtime.text import word_spans


def tagger_labels(ckpt: str, model, tokenizer) -> list[str]:
    """The tags of the entity tagger loaded from ckpt (model, tokenizer); a ValueError for any
    other model."""
    labels = load_labels(ckpt)
    if not isinstance(model, BERT) or labels is None or model.config.pooling != "token":
        raise ValueError(f"{ckpt} holds no entity tagger (a bert with pooling token); train one "
                         "with python -m pygpt.train --task tag")
    require_specials(tokenizer.special_tokens, tokenizer.encoding_needs, "texts to tag")
    return labels


def load_tagger(ckpt: str, kernels: str = "ext") -> tuple[BERT, object, list[str]]:
    """(model, tokenizer, tags) of an entity tagger's checkpoint; a ValueError for any other."""
    model, tokenizer = load(ckpt, kernels=kernels)
    return model, tokenizer, tagger_labels(ckpt, model, tokenizer)


def encode(sentences: Sequence[Sentence], model: BERT, tokenizer, labels: Sequence[str],
           source: object) -> EncodedTags:
    """sentences as the tagger's rows, split and overlapping as in training."""
    block = model.config.block_size
    return EncodedTags(sentences, labels, tokenizer, block, overlap_for(block), source)


def tag_text(model: BERT, tokenizer, labels: Sequence[str], text: str, where: str = "--text"
             ) -> list[tuple[str, int, int]]:
    """The entities of text, in order: (type, start, end), [start, end) its characters. The
    text is cut into words as a WordPiece tokenizer splits it (whitespace, each punctuation
    character), which is how CoNLL files hold them. Errors name the text as where."""
    spans = word_spans(text)
    if not spans:
        raise ValueError(f"{where} holds no words")
    words = tuple(text[start:end] for start, end in spans)
    tags = predict_tags(model, encode([Sentence(words, (OUTSIDE,) * len(words), 1)], model,
                                      tokenizer, labels, where), labels)[0]
    return text_entities(tags, spans)


def main(argv: Optional[list[str]] = None) -> None:
    p = task_parser("tag", __doc__, "an entity tagger's checkpoint folder (python -m "
                                    "pygpt.train --task tag)", "rows")
    p.add_argument("--text", default=None, help="a text whose entities to print (default: "
                                                "none; give --text or --data)")
    p.add_argument("--data", default=None, help="a CoNLL file (a word and its BIO tag a line, a "
                                                "blank line between sentences) to score the "
                                                "tagger on (default: none)")
    args = p.parse_args(argv)
    with task_run(args):
        if (args.data is None) == (args.text is None):
            raise ValueError("give either --data (a CoNLL file) or --text")
        if args.text is not None:
            utf8_text(args.text, "--text")
        model, tokenizer, labels = load_tagger(args.ckpt, args.kernels)
        if args.text is not None:
            found = tag_text(model, tokenizer, labels, args.text)
            print("\n".join(entity_lines(args.text, found)))
        else:
            tagged = read_conll(args.data)
            encoded = encode(tagged.sentences, model, tokenizer, labels, Path(args.data))
            predicted = predict_tags(model, encoded, labels, args.batch_size)
            print(file_report(tagged, score([s.tags for s in tagged.sentences], predicted)))


if __name__ == "__main__":
    main()
