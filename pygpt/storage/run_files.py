"""The names of every file pygpt writes into a folder, in one place.

A checkpoint folder (`python -m pygpt.train --out`) holds the model's settings, tokenizer and
weights, the training state for --resume, the metrics log and its picture (and a classifier's
labels). An export folder
(`python -m pygpt.export --out`) holds the ONNX models, a copy of the tokenizer and the runner's
config, named apart from the checkpoint's so that neither is mistaken for the other.
"""
from __future__ import annotations

# Checkpoint folder.
CONFIG = "config.json"  # model and training settings
TOKENIZER = "tokenizer.json"
WEIGHTS = "model.safetensors"
TRAIN_STATE = "train_state.pt"  # optimizer, step and RNG states, for --resume
METRICS = "metrics.jsonl"  # one JSON record per evaluation
LOSS_PLOT = "loss.png"
LABELS = "labels.json"  # a classifier's class names, in the order of its outputs

# Export folder (also read by pygpt_runtime, which cannot import pygpt).
ONNX_FP32 = "model.onnx"
ONNX_INT8 = "model.int8.onnx"
RUNNER_CONFIG = "runner.json"
