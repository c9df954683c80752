"""Configuration: a model's shape (ModelConfig) and a training run's settings (TrainConfig) as
dataclasses whose fields are the flags of `python -m pygpt.train` (pygpt.config.flags) and the
keys of config.json (pygpt.config.fields says how a field is declared, checked and saved); the
named starting points are pygpt.config.presets."""
from pygpt.config.model import ARCHS, MAX_NUMBERS, MAX_SIZES, ModelConfig
from pygpt.config.training import DTYPES, KERNEL_SETS, TrainConfig

__all__ = ["ARCHS", "DTYPES", "KERNEL_SETS", "MAX_NUMBERS", "MAX_SIZES", "ModelConfig", "TrainConfig"]
