"""`python -m pygpt.train`: trains a model on a text file (by default the tiny-Shakespeare text
shipped in the package), or a translator (--arch seq2seq) on sentence pairs, and writes a
checkpoint folder that pygpt.generate (pygpt.translate), pygpt.load and the ONNX exporter read.
This module is the command line: flags, presets, --resume and --init-from checks, the run
folder (pygpt.training.run_folder: locked, and never mixing two runs' files) and the exit status
(0; 1 with one `error:` line; 130 or 143 after a Ctrl-C or SIGTERM stopped and saved the run);
the loop itself is pygpt.training. Everything a run can check (flags, data files, the folder) is
checked before anything in the folder is written, and an earlier run's files (--overwrite) go
only with the new run's first save.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional

from pygpt.storage import checkpoint
from pygpt.config.flags import add_dataclass_flags, overrides
from pygpt.config import ModelConfig, TrainConfig
from pygpt.config.fields import applies, config_from_dict, tagged
from pygpt.data.text import check_data_file
from pygpt.families import FAMILIES, family
from pygpt.tasks import TOKEN_HEADS
from pygpt.mixed_precision import check_dtype, default_dtype
from pygpt.config.presets import PRESETS, preset
from pygpt.storage.run_files import CONFIG
from pygpt.training import train
from pygpt.training.prepare import default_threads
from pygpt.training.run_folder import RUN_FILES, RunFolder
from pygpt.training.stop import StopRequest

DEFAULT_BPE_VOCAB = 1024


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pygpt.train",
        description="Train a GPT (next-token) or a BERT (masked-LM and next-sentence "
                    "pretraining) on a text file with pygpt's kernels, fine-tune a BERT to "
                    "classify labelled texts (--task classify --init-from runs/bert --data "
                    "train.tsv), or train a translator on sentence pairs (--arch seq2seq "
                    "--src-data train.de.gz --tgt-data train.en.gz). Flags not given come from "
                    "the preset (or, with --resume, from the checkpoint being continued). "
                    "--task tag fine-tunes a BERT to tag named entities in a CoNLL file, --task "
                    "qa to answer questions from a context (SQuAD JSON). A run "
                    "locks --out (a second run into it is refused); Ctrl-C or SIGTERM finishes "
                    "the step, saves and exits (130, 143), a second Ctrl-C interrupts; a nan or "
                    "inf loss stops the run (exit 1) before anything is saved.",
        epilog="presets: " + "; ".join(
            f"{name}: {p.model.n_layer} layers, {p.model.n_head} heads, {p.model.n_embd} wide, "
            f"context {p.model.block_size}, batch {batch_size(p.model, p.train)}, "
            + (f"{p.train.epochs:g} epochs" if p.train.epochs else f"{p.train.max_iters} iters")
            for name, p in PRESETS.items()))
    parser.add_argument("--preset", choices=list(PRESETS), default=None,
                        help="starting configuration (default: " + ", ".join(
                            f"{f.preset_for(task)} for --arch {arch}"
                            + ("" if task == "pretrain" else f" --task {task}")
                            for arch, f in FAMILIES.items() for task in f.tasks)
                        + "; with --init-from, a fine-tuning task's -pretrained preset)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run saved in --out (exactly where it stopped)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run in an --out holding an earlier pygpt run: its files "
                             "(checkpoint, metrics, plot) are replaced by the new run's first "
                             "save (a run that fails before it leaves them whole); other files "
                             "are left alone, and a folder holding no pygpt run (an export, "
                             "another library's model) is refused. Without it a new run needs "
                             "an empty or new folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true",
                        help="end with the last metrics as one JSON line instead of a sentence")
    add_dataclass_flags(parser, ModelConfig, "model")
    add_dataclass_flags(parser, TrainConfig, "training")
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    model_flags, train_flags = overrides(args, ModelConfig), overrides(args, TrainConfig)
    given = set(model_flags) | set(train_flags)
    if {"epochs", "max_iters"} <= given:
        raise SystemExit("give --epochs or --max-iters, not both")
    if {"warmup_frac", "warmup_iters"} <= given:
        raise SystemExit("give --warmup-frac or --warmup-iters, not both")
    if "max_iters" in given:  # a resumed run's new total, whatever epochs it was given
        train_flags["epochs"] = None
    if "warmup_iters" in given or ("max_iters" in given and args.resume):
        train_flags["warmup_frac"] = None  # a resumed run keeps the warmup it settled
    out = Path(train_flags.get("out", TrainConfig.out))
    if args.resume:
        saved = checkpoint.read_config(out)
        try:
            model_cfg = config_from_dict(ModelConfig, saved["model"])
            saved_train = config_from_dict(TrainConfig, saved.get("train"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{out / CONFIG}: cannot resume: {e}") from None
        changed = [f"--{k.replace('_', '-')} {v} (saved: {getattr(model_cfg, k)})"
                   for k, v in model_flags.items() if v != getattr(model_cfg, k)]
        if changed:  # flags equal to the saved values change nothing
            raise SystemExit("--resume continues the saved model; model flags cannot change "
                             f"it: {', '.join(changed)}")
        # The folder being resumed is where the run continues, wherever it was first written.
        train_flags.setdefault("out", str(out))
        train_cfg = _absolute_paths(dataclasses.replace(saved_train, **train_flags))
        # A run saved before --dtype existed trained in float32.
        train_cfg = _with_dtype(train_cfg, "float32")
        family(model_cfg.arch).check_settings(model_cfg, train_cfg, given)
        return model_cfg, train_cfg
    init_from = train_flags.get("init_from")
    if init_from is not None and Path(init_from).resolve() == out.resolve():
        raise SystemExit("--init-from and --out must differ: the source checkpoint is never "
                         "modified; fine-tuning writes its own folder")
    task = train_flags.get("task", preset(args.preset).train.task if args.preset else "pretrain")
    # Without --arch, the first family that trains for the task (a bert for classify).
    arch = model_flags.get("arch") or next(f.name for f in FAMILIES.values() if task in f.tasks)
    base = preset(args.preset or family(arch).preset_for(task, init_from is not None))
    train_cfg = _absolute_paths(dataclasses.replace(base.train, **train_flags))
    train_cfg = _with_dtype(train_cfg, default_dtype(train_cfg.device))
    if train_cfg.init_from is not None:
        return _fine_tune_model(train_cfg, model_flags, given, base.model.pooling), train_cfg
    if "vocab_size" in model_flags and train_cfg.tokenizer == "char":
        raise SystemExit("--vocab-size sets the size of a trained vocabulary (--tokenizer bpe or "
                         "wordpiece); a char tokenizer takes its vocabulary from the text")
    if train_cfg.tokenizer != "char" and base.train.tokenizer == "char":
        model_flags.setdefault("vocab_size", DEFAULT_BPE_VOCAB)  # the preset's is a char count
    model_cfg = dataclasses.replace(base.model, **model_flags)
    family(model_cfg.arch).check_settings(model_cfg, train_cfg, given)
    return model_cfg, train_cfg


def _absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """cfg with its input paths made absolute, as config.json records them: a --resume from
    another directory reads the same files. (No --data stays None: the shipped text.)"""
    return dataclasses.replace(cfg, **{f.name: os.path.abspath(getattr(cfg, f.name))
                                       for f in tagged(TrainConfig, "file")
                                       if getattr(cfg, f.name) is not None})


def _with_dtype(cfg: TrainConfig, default: str) -> TrainConfig:
    """cfg with its number type settled (default when --dtype was not given), as config.json
    records it; a ValueError if the device cannot compute in it."""
    cfg = dataclasses.replace(cfg, dtype=cfg.dtype or default)
    check_dtype(cfg.dtype, cfg.device)
    return cfg


def _check_data_files(model_cfg: ModelConfig, train_cfg: TrainConfig) -> None:
    """Each data file of the run exists, is readable and not empty (before the folder is
    touched); whether they parse shows when the run reads them."""
    for name, path in family(model_cfg.arch).data_files(train_cfg):
        check_data_file(path, name)


def _fine_tune_model(train_cfg: TrainConfig, model_flags: dict[str, Any], given: set[str],
                     preset_pooling: str) -> ModelConfig:
    """The source checkpoint's model; only dropout and a BERT's pooling may change for
    fine-tuning (neither changes the weights). A tagger reads each token (its preset's pooling
    token), a question answerer each token for a span (pooling span); a classifier keeps the
    source's pooling of the sequence (a Hugging Face import's cls, with its trained pooler;
    bert-baby's mean), so that it converts back as it came, unless --pooling says otherwise or
    the source is itself a per-token model (then the preset's, mean)."""
    source = Path(train_cfg.init_from)
    if "tokenizer" in given:
        raise SystemExit("--init-from keeps the source's tokenizer; --tokenizer cannot change it")
    changed = sorted(set(model_flags) - {"dropout", "pooling"})
    if changed:
        raise SystemExit("--init-from keeps the source model's shape; these flags cannot change "
                         f"it: {', '.join('--' + k.replace('_', '-') for k in changed)}")
    try:
        model_cfg = config_from_dict(ModelConfig, checkpoint.read_config(source)["model"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source / CONFIG}: cannot fine-tune from it: {e}") from None
    if train_cfg.task != "pretrain" and applies(ModelConfig, "pooling", model_cfg.arch) and (
            preset_pooling in TOKEN_HEADS or model_cfg.pooling in TOKEN_HEADS):
        model_flags = {"pooling": preset_pooling, **model_flags}
    head = {"num_labels": 0} if train_cfg.task != "pretrain" else {}  # a fresh head, sized
    tuned = dataclasses.replace(model_cfg, **model_flags, **head)   # by the task's labels
    family(tuned.arch).check_settings(tuned, train_cfg, given)
    return tuned


def batch_size(model_cfg: ModelConfig, train_cfg: TrainConfig) -> str:
    """A micro-batch's size: sequences of the context's length, or a translator's token budget
    (the family whose batches --batch-size does not size)."""
    if applies(TrainConfig, "batch_size", model_cfg.arch):
        return f"{train_cfg.batch_size} x {model_cfg.block_size} tokens"
    return f"{train_cfg.max_tokens} tokens"


def describe_start(args: argparse.Namespace, model_cfg: ModelConfig,
                   train_cfg: TrainConfig) -> str:
    """The line a run starts with, before anything slow: what it trains, from which preset or
    run, its shape, length and batch, number type and device, and where it writes."""
    if args.resume:
        origin = f"resuming {train_cfg.out}"
    elif train_cfg.init_from is not None:
        settings = args.preset or family(model_cfg.arch).preset_for(train_cfg.task, True)
        origin = f"fine-tuning {train_cfg.init_from}, preset {settings}"
    else:
        origin = f"preset {args.preset or family(model_cfg.arch).preset_for(train_cfg.task)}"
    accumulated = f" x {train_cfg.grad_accum}" if train_cfg.grad_accum > 1 else ""
    length = (f"{train_cfg.max_iters} steps" if train_cfg.epochs is None
              else f"{train_cfg.epochs:g} epochs")
    threads = train_cfg.threads or default_threads()
    return (f"pygpt.train: {model_cfg.arch} {train_cfg.task} ({origin}): {model_cfg.n_layer} "
            f"layers, {model_cfg.n_head} heads, {model_cfg.n_embd} wide, context "
            f"{model_cfg.block_size}; {length} of {batch_size(model_cfg, train_cfg)}{accumulated}; "
            f"{train_cfg.dtype} on {train_cfg.device} ({threads} thread{'s' * (threads > 1)}); into "
            f"{train_cfg.out}\n{describe_settings(model_cfg, train_cfg)}")


def describe_settings(model_cfg: ModelConfig, train_cfg: TrainConfig) -> str:
    """The optimisation settings a run starts with (and, for a BERT, the pooling its head
    reads), so that a preset's choices are seen before the run, not found in docs/."""
    if train_cfg.optimizer == "sgd":
        optimizer = f"SGD, lr {train_cfg.lr:g}"
    else:
        optimizer = (f"AdamW, lr {train_cfg.lr:g}, betas ({train_cfg.beta1:g}, "
                     f"{train_cfg.beta2:g}), weight decay {train_cfg.weight_decay:g}")
    warmup = (f"{train_cfg.warmup_frac:g} of the steps" if train_cfg.warmup_frac is not None
              else f"{train_cfg.warmup_iters} steps")
    schedule = (f"warmup {warmup}, then {train_cfg.schedule}"
                + (f" to {train_cfg.min_lr:g}" if train_cfg.schedule != "constant" else ""))
    pooling = (f"; pooling {model_cfg.pooling}"
               if applies(ModelConfig, "pooling", model_cfg.arch) else "")
    clip = f", clipping at {train_cfg.grad_clip:g}" if train_cfg.grad_clip > 0 else ""
    return f"  settings: {optimizer}; {schedule}{clip}{pooling}"


def next_step(model_cfg: ModelConfig, train_cfg: TrainConfig, result: dict[str, Any]) -> str:
    """The line a run ends with: where its checkpoint is, its val loss, and what to run next."""
    command = family(model_cfg.arch).next_command(train_cfg.out, model_cfg, train_cfg)
    if "val_loss" not in result:
        done = (f"nothing to train: {train_cfg.out} is at step {result['step']} and --max-iters "
                f"is {train_cfg.max_iters}")
    else:
        done = (f"checkpoint of step {result['step']} in {train_cfg.out}, val loss "
                f"{result['val_loss']:.4f}")
    return f"{done}; next: {command}"


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    is_main = os.environ.get("RANK", "0") == "0"  # only rank 0 of torchrun owns the folder
    stop = StopRequest()
    try:
        model_cfg, train_cfg = configs_from_args(args)
        _check_data_files(model_cfg, train_cfg)
        if is_main and not args.quiet:
            print(describe_start(args, model_cfg, train_cfg), flush=True)
        with (RunFolder(train_cfg.out) if is_main else contextlib.nullcontext()) as folder:
            fresh = folder is not None and not args.resume
            if fresh:
                folder.check_new_run(args.overwrite, resumable=True)
            result = train(model_cfg, train_cfg, resume=args.resume, progress=not args.quiet,
                           stop=stop, replacing=RUN_FILES if fresh and args.overwrite else ())
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:  # a save or a file the OS refused (no space left, a read-only disk)
        raise SystemExit(f"error: {e.filename}: {e.strerror}" if e.filename
                         else f"error: {e.strerror or e}") from None
    except KeyboardInterrupt:  # a second Ctrl-C (or one before training began)
        print("interrupted: the last checkpoint saved (if any) is intact; continue it with "
              "--resume", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    if is_main:
        print(json.dumps(result) if args.json else next_step(model_cfg, train_cfg, result))
    if stop.requested:
        raise SystemExit(stop.exit_status)


if __name__ == "__main__":
    main()
