"""pygpt: small transformers trained and served on their own C++ kernels.

    model, tokenizer = pygpt.load("out/")
    ids = torch.tensor([tokenizer.encode("ROMEO:")])
    print(tokenizer.decode(model.generate(ids, 200, sampling=Sampling(top_k=40))[0]))
"""
from __future__ import annotations

__version__ = "0.1.0"


def load(path, kernels: str = "ext", device: str = "cpu"):
    """(model, tokenizer) from a checkpoint folder written by `python -m pygpt.train`."""
    from pygpt.checkpoint import load as load_checkpoint

    return load_checkpoint(path, kernels=kernels, device=device)
