"""What a model family is to the rest of pygpt: one object per family (pygpt.families.gpt, .bert,
.seq2seq) owns its model class, the special tokens its tokenizer learns, its training task and
how it prepares its config for it (a classifier's labels), the checks of the settings that
concern it (another family's or task's refused from the configs' tags), its attention parts and
how it frames a text for them, its ONNX exporter, its default preset and the command a finished
run suggests next. The command lines, the training loop, pruning, the attention maps, the
checkpoint loader, the exporter and the server ask the family for these, never test which family
they hold, so a new family is a new module here (and its model and task), not a change spread
over the package."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from pygpt.config import ModelConfig, TrainConfig
from pygpt.config.fields import families_of
from pygpt.data.text import read_chunks
from pygpt.inspect.attention_maps import MapInputs, batch_rows, encode_text
from pygpt.nn.distill_loss import LogitRows
from pygpt.onnx.int8 import Int8Settings
from pygpt.tokenizer import Specials, Tokenizer
from pygpt.tasks import Task


def flag(name: str) -> str:
    """The command-line flag of a config field."""
    return "--" + name.replace("_", "-")


class Family:
    """The defaults every family shares; a family overrides what differs."""

    name: str  # the config's `arch`
    model: type[nn.Module]
    default_preset: str  # pygpt.config.presets' name of the run a bare --arch starts from
    tasks: tuple[str, ...] = ("pretrain",)  # the values of --task it trains for
    specials: Specials = False  # the special tokens its tokenizer learns (pygpt.tokenizer)
    trains_on = "--data in batches of --batch-size sequences"  # what a refusal points to
    # Its attention maps (pygpt.inspect.attention_maps): the parts, in the order they run, the
    # one drawn by default, the special tokens around a text (whose own specials, such as
    # [MASK], are then parsed), and whether a text pairs with a target (a translation).
    attention_parts: tuple[str, ...] = ("self",)
    default_attention_part = "self"
    text_specials: tuple[str, ...] = ()
    has_target = False
    # Whether --quantize int8 scales each weight per output channel unless told (else one scale
    # per tensor, the smaller and, where it loses nothing measurable, the default).
    int8_per_channel = False

    def build(self, cfg: ModelConfig, kernels: str = "ext") -> nn.Module:
        """A freshly initialised model of this family on the given kernel set."""
        return self.model(cfg, kernels=kernels)

    def preset_for(self, task: str, pretrained: bool = False) -> str:
        """The preset a run of this family starts from when --preset is not given (pretrained:
        one fine-tuning a trained model, --init-from)."""
        return self.default_preset

    def head_task(self, model_cfg: ModelConfig) -> str:
        """The task whose head a model of model_cfg carries (what a run without saved training
        settings, a converted model's, trains it for): pretrain by default."""
        return "pretrain"

    def check_settings(self, model_cfg: ModelConfig, train_cfg: TrainConfig,
                       given: set[str]) -> None:
        """Refuses (ValueError, one line) settings that do not apply to this family; given: the
        names of the flags on the command line. By default: a task it does not train for, and
        the training settings of another family or task (refuse_foreign)."""
        if train_cfg.task not in self.tasks:
            where = (f"{train_cfg.init_from} holds a {self.name}" if train_cfg.init_from
                     else f"--arch must be bert, not {self.name}")
            raise ValueError(f"--task {train_cfg.task} fine-tunes a bert; {where}")
        self.refuse_foreign(train_cfg, given)

    def refuse_foreign(self, train_cfg: TrainConfig, given: set[str]) -> None:
        """Refuses a training setting that its tags (pygpt.config.fields) give to another task
        or family, when given on the command line or, for an input file, set at all."""
        for f in dataclasses.fields(train_cfg):
            if not (f.name in given or f.metadata["file"] and getattr(train_cfg, f.name)):
                continue
            tasks = f.metadata["task"]
            if tasks is not None and train_cfg.task not in tasks:
                raise ValueError(f"{flag(f.name)} is for --task {' or '.join(tasks)}, not "
                                 f"{train_cfg.task}")
            families = families_of(f)
            if families is not None and self.name not in families:
                raise ValueError(f"{flag(f.name)} is for --arch {' or '.join(families)}; "
                                 f"{self.name} trains on {self.trains_on}")

    def prepare_config(self, model_cfg: ModelConfig, train_cfg: TrainConfig, task: Task,
                       source_labels: Optional[Callable[[], Optional[list[str]]]]
                       ) -> tuple[ModelConfig, Optional[list[str]]]:
        """The model config a run builds, given its task on the data, and the labels it saves
        with each checkpoint (source_labels(): those of the run resumed or fine-tuned from;
        None for a run from scratch). By default the config as it is, and no labels."""
        return model_cfg, None

    def data_files(self, train_cfg: TrainConfig) -> list[tuple[str, Optional[str]]]:
        """(flag, path) of each data file the run reads (path None: the shipped text)."""
        return [("--data", train_cfg.data)]

    def tokenizer_text(self, train_cfg: TrainConfig) -> Any:
        """The text a new tokenizer is learned from: a string, or an iterable of them."""
        return read_chunks(train_cfg.data)

    def make_task(self, model_cfg: ModelConfig, train_cfg: TrainConfig, tokenizer: Tokenizer,
                  ranks: Any, labels: Optional[list[str]]) -> Task:
        """The training task on the run's data; labels: those a resumed run saved, if any."""
        raise NotImplementedError

    def distill_rows(self, model: nn.Module, batch: dict[str, Tensor],
                     with_output: bool) -> tuple[Any, LogitRows]:
        """What distillation compares (pygpt.nn.distill_loss): the model's logits at the rows its
        loss counts, on a training batch (the forward's keyword arguments), as LogitRows; and
        with_output, the model's usual output (its loss) from the same pass, else None."""
        raise NotImplementedError

    def export(self, model: nn.Module, tokenizer: Tokenizer, labels: Optional[list[str]],
               out_dir: Path, quantize: Optional[Int8Settings]) -> list[Path]:
        """Writes the ONNX export folder of a loaded model (with quantize, the int8 copies of its
        graphs too); returns the files written."""
        raise NotImplementedError

    def attention_layers(self, model: nn.Module) -> dict[str, list[nn.Module]]:
        """The model's attention layers (MultiHeadAttention) of each of attention_parts."""
        return {"self": [b.attn for b in model.blocks]}

    def attention_inputs(self, model: nn.Module, tokenizer: Tokenizer, texts: list[str],
                         targets: Optional[list[Optional[str]]], device: torch.device
                         ) -> MapInputs:
        """The texts as the model reads them, and how to run it over them (targets: a
        translator's, one per text, None for its own greedy translation; others ignore
        them). By default each text's tokens through the model, padded with id 0."""
        rows = [encode_text(tokenizer, t, model.config.block_size, "text") for t in texts]
        ids, lengths = batch_rows(rows, 0, device)
        return MapInputs(rows, [], self.attention_layers(model),
                         lambda: model(ids, lengths=lengths))

    def next_command(self, ckpt: str, model_cfg: ModelConfig, train_cfg: TrainConfig) -> str:
        """The command a finished run suggests, on its checkpoint folder ckpt."""
        raise NotImplementedError
