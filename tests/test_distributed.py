"""Multi-process training on torch.distributed (gloo on CPU): two ranks of batch B under torchrun
must step exactly like one process of batch 2B, and only rank 0 writes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pygpt.data.text import SHIPPED_TEXT

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or
                                not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _tiny_flags(data: Path, out: Path, batch: int) -> list[str]:
    return ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16",
            "--max-iters", "8", "--eval-interval", "4", "--eval-iters", "2", "--dropout", "0",
            "--grad-accum", "2", "--threads", "1", "--quiet", "--data", str(data),
            "--out", str(out), "--batch-size", str(batch)]


def _run(cmd: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(SHIPPED_TEXT.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          "-m", "pygpt.train", *_tiny_flags(data, ddp, batch=3)], tmp_path)
    _run([sys.executable, "-m", "pygpt.train", *_tiny_flags(data, single, batch=6)], tmp_path)

    ddp_weights, single_weights = load_file(ddp / "model.safetensors"), load_file(
        single / "model.safetensors")
    assert ddp_weights.keys() == single_weights.keys()
    for name in ddp_weights:
        torch.testing.assert_close(ddp_weights[name], single_weights[name], atol=1e-6, rtol=1e-5,
                                   msg=name)
    ddp_metrics, single_metrics = _metrics(ddp), _metrics(single)
    assert [m["step"] for m in ddp_metrics] == [4, 8]  # one record per evaluation: rank 0 only
    for a, b in zip(ddp_metrics, single_metrics):
        assert a["tokens"] == b["tokens"] == a["step"] * 6 * 2 * 16
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)
    assert sorted(p.name for p in ddp.iterdir() if not p.name.startswith(".")) == sorted(
        ["config.json", "loss.png", "metrics.jsonl", "model.safetensors", "tokenizer.json",
         "train_state.pt"])


def test_bert_pretrains_under_torchrun(tmp_path):
    """A BERT run under two ranks: rank 0 alone trains the WordPiece tokenizer (the other rank
    receives it), writes one metrics record per evaluation and the checkpoint. (Its losses are not
    compared with one process: each rank averages the masked-LM loss over its own masked tokens,
    so two ranks are not exactly one process with twice the batch.)"""
    data = tmp_path / "text.txt"
    data.write_text(SHIPPED_TEXT.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    out = tmp_path / "bert"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          "-m", "pygpt.train", "--arch", "bert", "--n-layer", "1", "--n-embd", "32", "--n-head",
          "2", "--block-size", "32", "--vocab-size", "300", "--max-iters", "6",
          "--eval-interval", "3", "--eval-iters", "2", "--batch-size", "4", "--threads", "1",
          "--quiet", "--data", str(data), "--out", str(out)], tmp_path)
    records = _metrics(out)
    assert [m["step"] for m in records] == [3, 6]
    assert all(0 <= m["val_mlm_acc"] <= 1 and m["val_loss"] > 0 for m in records)
    weights = load_file(out / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert json.loads((out / "config.json").read_text())["train"]["tokenizer"] == "wordpiece"
