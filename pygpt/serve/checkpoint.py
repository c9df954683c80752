"""`python -m pygpt.serve --ckpt RUN`: the HTTP server of a checkpoint of any family, on pygpt's
own torch model, with the attention maps the torch-free server of an export cannot give.

It is the export server (pygpt_runtime.serve: the same holder of a served model, routes, limits,
errors and playground; the routes by the runtime's table of families, pygpt_runtime.families)
over the checkpoint's torch model, which each family's opener here (OPENERS) wraps so that the
routes get pygpt's own code: a GPT's completions from its decoding (pygpt.serve.gpt_worker), a
BERT's fill-mask, classification, entities or answers and a translator's translations from the
functions of pygpt's commands (pygpt.serve.torch_tasks, on the export server's task worker: one
request at a time, a bounded queue); and POST /v1/attention gives pygpt.inspect.attention_maps'
probabilities for a text (pygpt.serve.attention), which the playground draws. Only the --ckpt
path imports torch (pygpt.serve stays torch-free for --model)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from pygpt.config import ARCHS
from pygpt.serve.attention import ServedAttention, attention_router
from pygpt.serve.gpt_worker import open_gpt
from pygpt.serve.model_lock import ModelLock
from pygpt.serve.torch_tasks import open_bert, open_translator
from pygpt.storage.checkpoint import load
from pygpt.tokenizer import Tokenizer
from pygpt_runtime.families import FAMILIES
from pygpt_runtime.serve.served import Limits, Served

# A family's opener: (checkpoint folder, its torch model and tokenizer, the lock every call on
# the model holds, the limits) -> the model its task's routes call, the worker that runs them,
# and what the export's runner.json would say that the holder reads ("task" where the family
# has several, "labels").
Opener = Callable[[str, nn.Module, Tokenizer, ModelLock, Limits], tuple[Any, Any, dict]]
OPENERS: dict[str, Opener] = {"gpt": open_gpt, "bert": open_bert, "seq2seq": open_translator}
assert set(OPENERS) == set(ARCHS), "every pygpt family has its opener here"


def open_checkpoint(ckpt: str, limits: Limits, threads: Optional[int] = None,
                    dtype: str = "float32") -> Served:
    """A checkpoint served on its torch model (the hook of pygpt_runtime.serve.command's
    --ckpt), computing in dtype (pygpt.mixed_precision), with the attention maps attached."""
    if threads is not None:
        torch.set_num_threads(threads)
    network, tokenizer = load(ckpt)
    family, lock = network.config.arch, ModelLock(dtype)
    model, worker, fields = OPENERS[family](ckpt, network, tokenizer, lock, limits)
    config = {"family": family, "task": FAMILIES[family].default_task(), **fields}
    served = Served(ckpt, config, model, tokenizer, worker, limits)
    attention = ServedAttention(network, tokenizer, lock, served.encode)
    served.attach("attention", attention.describe, attention_router(attention))
    return served
