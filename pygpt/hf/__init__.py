"""Hugging Face checkpoints in and out (`python -m pygpt.convert`): a local `transformers`
folder of GPT-2 or BERT becomes a pygpt run folder (import_folder), and a pygpt run becomes a
folder `transformers` loads (export_run). Each family's correspondence of settings and tensors
is its own module (gpt2, bert), the tokenizers are tokenizer_files, and the rules of reading a
folder from elsewhere are folder.

An import writes a normal checkpoint (pygpt.storage.checkpoint.save, step 0, no training state) into a
run folder that is new, empty, or (overwrite) an earlier pygpt run's, locked while it writes, as
`pygpt.train --out` treats its own. An export writes config.json, model.safetensors (the tensors
of the target class only, tied ones once, as `save_pretrained` does) and the tokenizer's files
as one change of a new or empty folder (pygpt.storage.atomic.FolderWrite: a staging folder, then the files
moved into place), so a failed export leaves no partial folder that `transformers` would load."""
from __future__ import annotations

import json
import os
import reprlib
from pathlib import Path
from types import ModuleType
from typing import Union

import torch
from safetensors.torch import save_file

from pygpt.storage import checkpoint
from pygpt.families import build
from pygpt.hf import bert, gpt2
from pygpt.hf.folder import CONFIG, WEIGHTS, WeightsFile, read_config
from pygpt.hf.mapping import Layout
from pygpt.hf.tokenizer_files import export_files, read_tokenizer
from pygpt.storage.atomic import FolderWrite, is_leftover
from pygpt.storage.targets import check_folder
from pygpt.training.run_folder import LOCK, RUN_FILES, RunFolder

FAMILIES: dict[str, ModuleType] = {gpt2.MODEL_TYPE: gpt2, bert.MODEL_TYPE: bert}
ARCH_FAMILIES = {"gpt": gpt2, "bert": bert}  # pygpt's arch -> the family it exports as
FRESH_SEED = 0  # the seed of the parts a folder lacks: the same import gives the same run


def _family(hf: dict) -> ModuleType:
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ValueError(f"config.json: unsupported model_type {reprlib.repr(model_type)} (pygpt "
                         f"converts {' and '.join(FAMILIES)})")
    return FAMILIES[model_type]


def read_folder(folder: Union[str, Path]) -> tuple[torch.nn.Module, object, list, Layout]:
    """The pygpt model (eval mode), tokenizer and class names (None: no classifier) of the HF
    folder, and its Layout; every check before any tensor is read."""
    folder = Path(folder)
    hf = read_config(folder)
    family = _family(hf)
    weights = WeightsFile(folder)
    layout = family.import_layout(hf, weights.names)
    tokenizer = read_tokenizer(folder, family.MODEL_TYPE, layout.config.vocab_size)
    with torch.device("meta"):
        own = build(layout.config).state_dict()
    weights.check({name: shape for m in layout.maps
                   for name, shape in zip(m.theirs, m.their_shapes(tuple(own[m.ours].shape)))},
                  layout.ignored)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FRESH_SEED)
        model = build(layout.config)
    state = {m.ours: m.to_ours({name: weights.tensor(name) for name in m.theirs})
             for m in layout.maps}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight", "mlm.decoder.weight"} if layout.config.tie_weights else set()
    left = [n for n in missing if n not in tied and not n.startswith(layout.fresh)]
    if left or unexpected:  # a map that does not cover the model: pygpt's own error
        raise RuntimeError(f"the {family.MODEL_TYPE} map leaves {left} unset, names {unexpected}")
    labels = bert.head_labels(hf, layout.config) if layout.config.num_labels else None
    return model.eval(), tokenizer, labels, layout


def import_folder(folder: Union[str, Path], out: Union[str, Path],
                  overwrite: bool = False) -> Layout:
    """Converts the HF folder into the run folder out (module docstring); returns its Layout."""
    with RunFolder(out, what="conversion") as run:
        run.check_new_run(overwrite)
        model, tokenizer, labels, layout = read_folder(folder)
        checkpoint.save(out, model, tokenizer, labels=labels, remove=RUN_FILES)
    return layout


def check_export_out(run: Path, out: Path) -> None:
    """Refuses an --out that is the run itself, a file, or a folder holding anything."""
    if out.resolve() == run.resolve():
        raise ValueError(f"--out {out} is the run folder itself; the export needs its own folder")
    check_folder(out, "--out")
    held = sorted(n for n in os.listdir(out) if n != LOCK and not is_leftover(n)) \
        if out.exists() else []
    if held:
        raise ValueError(f"--out {out} is not empty (it holds {', '.join(held[:5])}); export "
                         "into a new or empty folder")


def export_tensors(model: torch.nn.Module, maps: list) -> dict[str, torch.Tensor]:
    own = model.state_dict()
    return {name: t for m in maps for name, t in m.to_theirs(own[m.ours]).items()}


def export_run(run: Union[str, Path], out: Union[str, Path]) -> list[Path]:
    """Writes the pygpt run folder run as an HF folder out (module docstring); the files."""
    run, out = Path(run), Path(out)
    check_export_out(run, out)
    model, tokenizer = checkpoint.load(run, kernels="torch")
    cfg = model.config
    if cfg.arch not in ARCH_FAMILIES:
        raise ValueError(f"{run} holds a {cfg.arch} model, which has no GPT-2 or BERT "
                         "counterpart in transformers")
    labels = checkpoint.load_labels(run)
    hf, maps = ARCH_FAMILIES[cfg.arch].export_config(cfg, tokenizer.special_tokens, labels)
    tensors = export_tensors(model, maps)
    files = export_files(tokenizer, cfg.arch, cfg.block_size)
    with RunFolder(out, what="export"):
        check_export_out(run, out)
        with FolderWrite(out, index=CONFIG) as change:
            change.write(WEIGHTS, lambda path: save_file(tensors, str(path),
                                                         metadata={"format": "pt"}))
            for name, text in files.items():
                change.write(name, lambda path, text=text: path.write_text(text, "utf-8"))
            change.write(CONFIG, lambda path: path.write_text(json.dumps(hf, indent=2), "utf-8"))
    return change.files()


__all__ = ["export_run", "import_folder", "read_folder"]
