"""Hugging Face checkpoints in and out of pygpt:

    python -m pygpt.convert --from-hf gpt2-folder/ --out runs/gpt2      # a GPT-2 or BERT folder
    python -m pygpt.convert --to-hf runs/gpt2 --out gpt2-hf/            # for transformers

--from-hf reads a local `transformers` folder (config.json, model.safetensors, the tokenizer's
files) of GPT2LMHeadModel or GPT2Model, or of BertModel, BertForMaskedLM, BertForPreTraining,
BertForSequenceClassification, BertForTokenClassification or BertForQuestionAnswering, into a run
folder that pygpt.generate, fill_mask, classify, tag, answer, train --init-from and export take.
--to-hf writes a run's GPT as GPT2LMHeadModel, its BERT as BertForPreTraining, BertForMaskedLM,
BertForSequenceClassification, BertForTokenClassification or BertForQuestionAnswering, with its
tokenizer, into a
new folder `transformers` loads with from_pretrained. What either side cannot represent is
refused in one line naming the option (pygpt.hf)."""
from __future__ import annotations

import argparse
from typing import Optional

from pygpt.hf import export_run, import_folder
from pygpt_runtime.cli_checks import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pygpt.convert", description=__doc__,
                                formatter_class=HelpFormatter)
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-hf", metavar="DIR", help="a Hugging Face model folder to import")
    way.add_argument("--to-hf", metavar="RUN", help="a pygpt run folder to export")
    p.add_argument("--out", required=True,
                   help="the run folder to write (--from-hf) or the new Hugging Face folder "
                        "(--to-hf) (required)")
    p.add_argument("--overwrite", action="store_true",
                   help="--from-hf: replace an earlier pygpt run in --out")
    return p


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if args.from_hf is not None:
            layout = import_folder(args.from_hf, args.out, args.overwrite)
            fresh = f" (initialised afresh: {', '.join(layout.fresh)})" if layout.fresh else ""
            print(f"wrote the {layout.config.arch} run {args.out}{fresh}")
        else:
            if args.overwrite:
                raise ValueError("--overwrite applies to --from-hf only; --to-hf writes a new "
                                 "folder")
            for path in export_run(args.to_hf, args.out):
                print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:
        raise SystemExit(f"error: {e.filename or args.out}: {e.strerror or e}") from None


if __name__ == "__main__":
    main()
