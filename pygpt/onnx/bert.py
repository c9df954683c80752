"""A BERT checkpoint to ONNX (called by pygpt.export for BERT checkpoints), in the convention HF
and Optimum use: inputs `input_ids`, `attention_mask` (1 for real tokens; right padding, as the
tokenizers of HF give) and `token_type_ids` (0 for segment A, 1 for B), all (batch, seq) int64;
output `logits`: the masked-LM logits (batch, seq, vocab) of a pretrained model ("fill-mask"),
the class logits (batch, num_labels) of a classifier ("classify"), or a head per token's
(batch, seq, num_labels): an entity tagger's tag logits ("tag") or a question answerer's start
and end logits ("qa", num_labels 2: [..., 0] the start's). Batch and seq (up to
block_size) are dynamic. The graph turns the mask into per-row lengths, sum(attention_mask, 1),
which our attention op takes (the translation builds the padding mask from them), so it is
exactly BERT.forward(input_ids, token_type_ids, lengths). Checked against PyTorch on padded
batches before anything is written; `runner.json` tells pygpt_runtime the task, labels and
special tokens.

The folder is written by pygpt.onnx.graph.write_export, as a whole."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch

from pygpt.models import BERT
from pygpt.onnx.graph import models_entry, to_onnx, write_export
from pygpt.onnx.int8 import Int8Settings
from pygpt.storage.run_files import ONNX_FP32
from pygpt.tasks import TOKEN_HEADS
from pygpt.tokenizer import require_specials

INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUTS = ["logits"]


class _Encoder(torch.nn.Module):
    """The model as the exported graph sees it: HF's three inputs in, one head's logits out."""

    def __init__(self, model: BERT):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        lengths = attention_mask.sum(dim=1)
        out = self.model(input_ids, segment_ids=token_type_ids, lengths=lengths)
        return out.logits if self.model.classifier is not None else out.mlm_logits


def padded_batch(vocab_size: int, lengths: Sequence[int], seed: int = 0,
                 ) -> dict[str, torch.Tensor]:
    """The three inputs of a right-padded batch of random ids with rows of the given lengths
    (the second half of each row in segment B, padding 0 in every input)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab_size, (len(lengths), max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    types = ((torch.arange(max(lengths))[None] >= torch.tensor(lengths)[:, None] // 2)
             .long() * mask)
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


def _to_onnx(model: BERT, path: Path) -> None:
    from torch.export import Dim

    batch = Dim("batch", min=1, max=4096)
    seq = Dim("seq", min=1, max=model.config.block_size)
    example = padded_batch(model.config.vocab_size, [min(3, model.config.block_size), 2])
    dynamic = {name: {0: batch, 1: seq} for name in INPUTS}
    to_onnx(_Encoder(model), tuple(example[name] for name in INPUTS), path, INPUTS, OUTPUTS,
            dynamic, model.config.block_size)


def _check_against_torch(model: BERT, path: Path, tol: float = 1e-4) -> None:
    """Padded batches of two sizes must give PyTorch's logits at every real position."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    block = model.config.block_size
    for lengths in ([block], [min(5, block), 1, max(1, block // 2)]):
        batch = padded_batch(model.config.vocab_size, lengths, seed=len(lengths))
        with torch.no_grad():
            expected = _Encoder(model)(*batch.values()).numpy()
        got = session.run(None, {name: t.numpy() for name, t in batch.items()})[0]
        if expected.ndim == 3:  # logits per token: the padded positions are no one's
            real = batch["attention_mask"].numpy().astype(bool)
            expected, got = expected[real], got[real]
        err = float(np.abs(got - expected).max())
        if not err <= tol:
            raise RuntimeError(f"exported model disagrees with PyTorch: max logit error {err:.3g}")


def export_bert(model: BERT, tokenizer, labels: Optional[list[str]], out_dir,
                quantize: Optional[Int8Settings] = None) -> list[Path]:
    """Exports a loaded BERT (with its tokenizer, and labels for a classifier, a tagger or an
    answerer) into out_dir (with quantize, its int8 copy too); returns the files written.
    runner.json's task: "fill-mask" without a head, a head per token's --task (TOKEN_HEADS:
    "tag", "qa"), else "classify"."""
    head = TOKEN_HEADS.get(model.config.pooling)
    require_specials(tokenizer.special_tokens, ("[PAD]", "[CLS]", "[SEP]", "[MASK]"),
                     "a BERT export's runner")
    model.eval()
    cfg = model.config
    runner_config = {"family": "bert",
                     "task": ("fill-mask" if model.classifier is None
                              else head.task if head is not None else "classify"),
                     "labels": labels, "vocab_size": cfg.vocab_size,
                     "block_size": cfg.block_size, "inputs": INPUTS, "outputs": OUTPUTS}
    return write_export(Path(out_dir), {ONNX_FP32: lambda path: _to_onnx(model, path)},
                        lambda folder: _check_against_torch(model, folder / ONNX_FP32),
                        quantize, tokenizer,
                        {**runner_config, "models": models_entry(ONNX_FP32, quantize)})
