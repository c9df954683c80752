"""pygpt: a small GPT trained and served on its own C++ kernels."""

__version__ = "0.1.0"
