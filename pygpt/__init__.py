"""pygpt: small transformers trained and served on their own C++ kernels.

    model, tokenizer = pygpt.load("out/")
    ids = torch.tensor([tokenizer.encode("ROMEO:")])
    print(tokenizer.decode(model.generate(ids, 200, sampling=Sampling(top_k=40))[0]))
"""
from __future__ import annotations

import importlib.metadata
from typing import Optional

__version__ = "0.1.0"

REBUILD = "pip install --no-build-isolation --force-reinstall ."


def torch_mismatch(built: str, running: str) -> Optional[str]:
    """The one-line error when the running torch is another release than the one pygpt._C was
    compiled against (local labels such as +cpu are builds of one release), else None."""
    if built.split("+")[0] == running.split("+")[0]:
        return None
    return (f"pygpt's extension was built against torch {built}, but torch {running} is "
            f"installed: rebuild pygpt against it with `{REBUILD}` in pygpt's source folder, or "
            f"install torch=={built.split('+')[0]}")


def _check_torch() -> None:
    """An ImportError unless pygpt/_build_info.py (written by setup.py with pygpt._C) names the
    installed torch's release; read from its metadata, so `import pygpt` does not import torch."""
    try:
        from pygpt._build_info import TORCH_VERSION
    except ImportError:
        raise ImportError("pygpt's extension was not built by setup.py (pygpt/_build_info.py is "
                          f"missing): build it with `{REBUILD}` in pygpt's source folder, or "
                          "`python setup.py build_ext --inplace` in a checkout") from None
    try:
        running = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"pygpt needs torch=={TORCH_VERSION.split('+')[0]}, the release its "
                          "extension was built against, and torch is not installed") from None
    error = torch_mismatch(TORCH_VERSION, running)
    if error is not None:
        raise ImportError(error)


_check_torch()


def load(path, kernels: str = "ext", device: str = "cpu"):
    """(model, tokenizer) from a checkpoint folder written by `python -m pygpt.train`."""
    from pygpt.storage.checkpoint import load as load_checkpoint

    return load_checkpoint(path, kernels=kernels, device=device)
