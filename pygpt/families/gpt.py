"""The decoder-only GPT: next-token pretraining on a text, text generation, and its export as one
ONNX graph with a KV cache (pygpt.onnx.gpt)."""
from __future__ import annotations

import shlex

from pygpt.data.text import TokenFile
from pygpt.onnx.gpt import export_gpt
from pygpt.families.base import Family
from pygpt.models import GPT
from pygpt.nn.distill_loss import LogitRows
from pygpt.tasks import LanguageModelling


class GPTFamily(Family):
    name = "gpt"
    model = GPT
    default_preset = "baby"

    def make_task(self, model_cfg, train_cfg, tokenizer, ranks, labels):
        """Rank 0 writes the token cache first; the other ranks then map it."""
        token_file = TokenFile.load(train_cfg.data, tokenizer) if ranks.is_main else None
        ranks.barrier()
        return LanguageModelling(token_file or TokenFile.load(train_cfg.data, tokenizer),
                                 model_cfg.block_size)

    def distill_rows(self, model, batch, with_output):
        """Every position's next-token logits."""
        x = model.features(batch["idx"])
        rows = LogitRows(x.reshape(-1, x.shape[-1]), model.lm_head.weight, model.lm_head.bias)
        return (model.head(x, batch["targets"]) if with_output else None), rows

    def export(self, model, tokenizer, labels, out_dir, quantize):
        return export_gpt(model, tokenizer, out_dir, quantize)

    def next_command(self, ckpt, model_cfg, train_cfg):
        return f"python -m pygpt.generate --ckpt {shlex.quote(ckpt)} --prompt 'ROMEO:'"


GPT_FAMILY = GPTFamily()
