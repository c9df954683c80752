"""Opening a pygpt ONNX export folder (its runner.json: runner_config.py; its tokenizer:
text.py) and running its graphs, with numpy and onnxruntime: part of the deployment side, beside
run_onnx.py."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnxruntime as ort

from pygpt_runtime.runner_config import check_block_size, read_config
from pygpt_runtime.text import load_tokenizer, require_file


def open_session(path: Path, threads: Optional[int], inputs: Sequence[str],
                 config: dict) -> ort.InferenceSession:
    """An onnxruntime session of one model file, which takes the inputs its runner.json
    (config) names and holds its block_size positions; a missing, truncated or damaged file, or
    a graph of another kind, is a one-line FileNotFoundError / ValueError naming it."""
    require_file(path)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failed run is reported by run_graph, in one line
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's load errors (InvalidProtobuf, Fail, ...) share no base
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not a model onnxruntime can load (truncated or damaged?"
                         f" export again): {reason}") from None
    takes = sorted(i.name for i in session.get_inputs())
    if takes != sorted(inputs):
        raise ValueError(f"{path} takes the inputs {', '.join(takes)}, not the "
                         f"{', '.join(inputs)} of its runner.json: a graph of another model "
                         "(export again)")
    check_block_size(config, path, session.get_modelmeta().custom_metadata_map)
    return session


def run_graph(session: ort.InferenceSession, feeds: dict) -> list:
    """The outputs of one run of session; a ValueError when it fails (a graph of other shapes
    than runner.json's) or when the first output (the logits, or the encoder's states) holds NaN
    or infinity, as a graph of damaged weights gives: confident garbage otherwise."""
    try:
        outputs = session.run(None, feeds)
    except Exception as e:  # onnxruntime's run errors share no base
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"the model does not run on the inputs its runner.json describes "
                         f"(export again): {reason}") from None
    if not np.isfinite(outputs[0]).all():
        raise ValueError("the model's outputs are not finite numbers (NaN or infinity): its "
                         "weights are damaged (export again)")
    return outputs


def open_export(folder: Path, variant: str = "fp32", threads: Optional[int] = None,
                family: Optional[str] = None, refusal: str = ""):
    """(runner config, onnxruntime session, tokenizer) of an export folder (with family: of that
    family, else a ValueError ending in refusal; see read_config)."""
    config = read_config(folder, family, refusal)
    if variant not in config["models"]:
        raise ValueError(f"no {variant} model in {folder} (has: {', '.join(config['models'])})")
    tokenizer = load_tokenizer(folder / config["tokenizer"]["file"], config["tokenizer"]["kind"],
                               config.get("vocab_size"))
    inputs = config.get("inputs", ["input_ids", "attention_mask", "token_type_ids"])
    session = open_session(folder / config["models"][variant], threads, inputs, config)
    return config, session, tokenizer
