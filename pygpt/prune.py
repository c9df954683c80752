"""`python -m pygpt.prune --ckpt RUN --out NEW (--heads-per-layer K | --head-fraction F)
[--mlp-fraction F] [--recover-iters N]`: structured pruning of any family's run.

Each attention head's and MLP hidden unit's importance is measured on --batches batches of the
run's own training task and data (a GPT's next-token loss, a BERT's masked-LM or its
classification loss, a translator's; --data, or --src-data / --tgt-data for a translator,
reads other data), drawn with a fixed seed so the same run scores the same
(pygpt.pruning.importance). --head-fraction ranks all layers' heads together, and then
--mlp-fraction all their MLP units: Michel et al.'s global pruning, so layers keep different
numbers (a translator's rank each layer, which keeps the same number: its config has no
per-layer sizes). --heads-per-layer K keeps the K best heads of each layer and --mlp-fraction
then the same number of MLP units in each: a uniform model, which Hugging Face's formats can
hold. The lowest-scoring are removed from the weights (pygpt.pruning.shrink). --recover-iters N
then
fine-tunes the pruned model N steps with the run's own training settings (pygpt.training's
loop, resuming a run that starts at step 0 from the pruned weights).

NEW is a normal run folder of the smaller model that every command, the exporter and the
runner read; --out follows pygpt.train's rules (a new or empty folder, or --overwrite over an
earlier run; never the source) and the folder changes as a whole (pygpt.storage.checkpoint.save)."""
from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Callable, Optional

import torch

from pygpt.storage import checkpoint
from pygpt.config import ModelConfig, TrainConfig
from pygpt.config.fields import applies, config_from_dict
from pygpt.data.text import check_data_file
from pygpt.families import family
from pygpt.config.presets import preset
from pygpt.pruning import (Scores, check_globally_prunable, check_prunable, choose,
                           choose_globally, importance, removed_count, shrink)
from pygpt.pruning.shrink import Keep
from pygpt.training import train
from pygpt.training.distributed import Distributed
from pygpt.training.prepare import default_threads
from pygpt.training.optim import make_optimizer
from pygpt.training.run_folder import RUN_FILES, RunFolder

SCORE_SEED = 0  # the generator the scoring batches are drawn from


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pygpt.prune",
                                     description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--ckpt", required=True, help="the run to prune (never modified)")
    parser.add_argument("--out", required=True, help="folder for the pruned run")
    heads = parser.add_mutually_exclusive_group(required=True)
    heads.add_argument("--heads-per-layer", type=_count, metavar="K",
                       help="attention heads each layer keeps, its K best (n_head: all)")
    heads.add_argument("--head-fraction", type=_fraction, metavar="F",
                       help="fraction of all the model's heads removed, the lowest scores of one "
                            "ranking over every layer, each layer keeping at least one (0: none;"
                            " a translator: of each layer's heads)")
    parser.add_argument("--mlp-fraction", type=_fraction, default=0.0, metavar="F",
                        help="fraction of the MLPs' hidden units removed: with --head-fraction "
                             "of all of them, ranked as its heads (each layer keeping at least "
                             "one); with --heads-per-layer of each layer's (default 0)")
    parser.add_argument("--recover-iters", type=int, default=0, metavar="N",
                        help="fine-tune the pruned model N steps with the run's training "
                             "settings (default 0: none)")
    parser.add_argument("--warmup-iters", type=int, default=None, metavar="N",
                        help="the recovery's warmup steps (default: the run's own)")
    parser.add_argument("--batches", type=_count, default=8, metavar="N",
                        help="training batches the importance is measured on (default 8)")
    parser.add_argument("--data", help="gpt, bert: score (and recover) on this data instead of "
                                       "the run's")
    parser.add_argument("--src-data", help="seq2seq: source sentences instead of the run's")
    parser.add_argument("--tgt-data", help="seq2seq: their translations, line for line")
    parser.add_argument("--threads", type=_count, help="torch threads (default: half the CPUs)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier pygpt run in --out (as pygpt.train's)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar while recovering")
    return parser


def run_settings(ckpt: Path, args: argparse.Namespace, model_cfg: ModelConfig) -> TrainConfig:
    """The source run's training settings (a converted model's: its family's preset), with the
    data flags given, out set to --out, and checked against the family."""
    saved = checkpoint.read_config(ckpt).get("train")
    if saved is None:
        cfg = preset(family(model_cfg.arch).preset_for(family(model_cfg.arch).head_task(model_cfg))).train
    else:
        try:
            cfg = config_from_dict(TrainConfig, saved)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{ckpt}: its training settings are invalid: {e}") from None
    given = {k: os.path.abspath(v) for k, v in (("data", args.data), ("src_data", args.src_data),
                                                 ("tgt_data", args.tgt_data)) if v is not None}
    fam = family(model_cfg.arch)
    fam.refuse_foreign(dataclasses.replace(cfg, **given), set(given))
    if given.keys() & {"src_data", "tgt_data"} and len(given) == 1:
        raise ValueError("--src-data and --tgt-data come together, line for line")
    if given.keys() & {"src_data", "tgt_data"}:  # the run's held-out pairs came from its own
        given.update(val_src=None, val_tgt=None)
    if "data" in given and cfg.task != "pretrain":
        given["val_data"] = None
    cfg = dataclasses.replace(cfg, out=os.path.abspath(args.out), threads=args.threads, **given)
    for name, path in fam.data_files(cfg):
        check_data_file(path, name)
    return cfg


def prune(args: argparse.Namespace) -> str:
    """Prunes args.ckpt into args.out; returns the line that reports it."""
    ckpt, out = Path(args.ckpt), Path(args.out)
    if out.resolve() == ckpt.resolve():
        raise ValueError("--out must differ from --ckpt: the source run is never modified")
    for name in ("recover_iters", "warmup_iters"):
        if (getattr(args, name) or 0) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must not be negative, got "
                             f"{getattr(args, name)}")
    model, tokenizer = checkpoint.load(ckpt)
    cfg = model.config
    labels = checkpoint.load_labels(ckpt)
    select = selection(model, args)
    train_cfg = run_settings(ckpt, args, cfg)
    torch.set_num_threads(train_cfg.threads or default_threads())
    with RunFolder(out, what="pruning") as folder:
        folder.check_new_run(args.overwrite,
                             continued_by=f"python -m pygpt.train --resume --out {out}")
        task = family(cfg.arch).make_task(cfg, train_cfg, tokenizer, Distributed("cpu"), labels)
        gen = torch.Generator().manual_seed(SCORE_SEED)
        batches = (task.batch("train", train_cfg.batch_size, gen) for _ in range(args.batches))
        scores = importance(model, batches)
        pruned = shrink(model, select(scores))
        state = None
        if args.recover_iters:  # a run at step 0, continued by the loop for N steps
            torch.manual_seed(train_cfg.seed)
            state = {"optimizer": make_optimizer(pruned, train_cfg).state_dict(),
                     "data_rng": torch.Generator().manual_seed(train_cfg.seed).get_state(),
                     "torch_rng": torch.get_rng_state(), "tokens": 0}
        removing = RUN_FILES if args.overwrite else ()
        checkpoint.save(out, pruned, tokenizer, train_cfg, state, step=0, labels=labels,
                        remove=removing)
        if args.recover_iters:
            recover_cfg = dataclasses.replace(
                train_cfg, max_iters=args.recover_iters, lr_decay_iters=None,
                eval_interval=min(train_cfg.eval_interval, args.recover_iters),
                warmup_iters=(train_cfg.warmup_iters if args.warmup_iters is None
                              else args.warmup_iters))
            result = train(pruned.config, recover_cfg, resume=True, progress=not args.quiet)
            recovered = f", recovered {args.recover_iters} steps: val loss {result['val_loss']:.4f}"
        else:
            recovered = ""
    before = sum(p.numel() for p in model.parameters())
    after = sum(p.numel() for p in pruned.parameters())
    return f"pruned {ckpt} into {out}: {kept_sizes(cfg, pruned.config)}, {after:,} of " \
           f"{before:,} parameters{recovered}"


def selection(model: torch.nn.Module, args: argparse.Namespace) -> Callable[[Scores], Keep]:
    """What the flags keep, as a function of the scores; checked before any scoring (one-line
    ValueError)."""
    cfg = model.config
    if args.heads_per_layer is not None or not applies(ModelConfig, "layer_heads", cfg.arch):
        # Each layer ranked alone, every layer keeping the same numbers (also for a family
        # whose config cannot hold per-layer sizes).
        heads = (args.heads_per_layer if args.heads_per_layer is not None
                 else cfg.n_head - removed_count(cfg.n_head, args.head_fraction))
        width = min(cfg.mlp_width_of(i) for i in range(cfg.n_layer))
        mlp_width = width - removed_count(width, args.mlp_fraction)
        check_prunable(cfg, heads, mlp_width)
        return lambda scores: choose(model, scores, heads, mlp_width)
    check_globally_prunable(cfg, args.head_fraction, args.mlp_fraction)
    return lambda scores: choose_globally(model, scores, args.head_fraction, args.mlp_fraction)


def kept_sizes(cfg: ModelConfig, new: ModelConfig) -> str:
    """What the report says is kept: per layer where every layer agrees, else in all with
    each layer's count."""
    mlp = cfg.mlp
    if not (cfg.layer_heads or cfg.layer_mlp_dims or new.layer_heads or new.layer_mlp_dims):
        mlps = f" and {new.mlp_width} of {cfg.mlp_width} MLP units" if mlp else ""
        return f"{new.n_head} of {cfg.n_head} heads{mlps} per layer kept"

    def sizes(size: Callable[[ModelConfig, int], int], what: str) -> str:
        kept = [size(new, i) for i in range(cfg.n_layer)]
        total = sum(size(cfg, i) for i in range(cfg.n_layer))
        return f"{sum(kept):,} of {total:,} {what} (per layer {', '.join(map(str, kept))})"

    mlps = f" and {sizes(ModelConfig.mlp_width_of, 'MLP units')}" if mlp else ""
    return f"kept {sizes(ModelConfig.heads, 'heads')}{mlps}"


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        print(prune(args))
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:
        raise SystemExit(f"error: {e.filename}: {e.strerror}" if e.filename
                         else f"error: {e.strerror or e}") from None


if __name__ == "__main__":
    main()
