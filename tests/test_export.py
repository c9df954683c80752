"""ONNX export and the torch-free runner: a tiny trained model, exported once (fp32 and int8),
must match PyTorch in onnxruntime for the prefill and 50 decode steps, continue greedily with the
same 200 tokens, and run in a process where torch cannot be imported; the default model, and one
with GPT-2's tanh GELU and a layer norm epsilon far from the default (so a graph that dropped
either would not match)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import RUNNER_COMMAND, torch_free_env
import pygpt
import pygpt.training.run_folder as run_folder
from pygpt import export as exporter
from pygpt.onnx import gpt as export_gpt
from pygpt.config import ModelConfig, TrainConfig
from pygpt.decoding.sampling import Sampling
from pygpt.storage.run_files import ONNX_FP32, ONNX_INT8, RUNNER_CONFIG, TOKENIZER
from pygpt.training import train
from pygpt_runtime import run_onnx, runner_config



MODEL_OPTIONS = {"default": {}, "gelu_tanh-eps": dict(activation="gelu_tanh", norm_eps=0.1)}


@pytest.fixture(scope="module", params=list(MODEL_OPTIONS))
def exported(request, tmp_path_factory):
    """(checkpoint folder, export folder) of a tiny model trained for a few steps."""
    root = tmp_path_factory.mktemp("export")
    ckpt, onnx_dir = root / "ckpt", root / "onnx"
    model_cfg = ModelConfig(block_size=24, n_layer=2, n_head=2, n_embd=32,
                            **MODEL_OPTIONS[request.param])
    train(model_cfg, TrainConfig(out=str(ckpt), max_iters=60, eval_interval=60, eval_iters=2,
                                 batch_size=8, warmup_iters=5), progress=False)
    exporter.export(ckpt, onnx_dir, quantize="int8")
    return ckpt, onnx_dir


def test_export_files(exported):
    ckpt, onnx_dir = exported
    names = sorted(p.name for p in onnx_dir.iterdir())
    assert names == ["model.int8.onnx", "model.onnx", "runner.json", "tokenizer.json"]
    assert names == sorted([ONNX_INT8, ONNX_FP32, RUNNER_CONFIG, TOKENIZER])
    assert runner_config.RUNNER_CONFIG == RUNNER_CONFIG  # the runner cannot import pygpt
    config = json.loads((onnx_dir / RUNNER_CONFIG).read_text())
    assert config["block_size"] == 24 and config["n_layer"] == 2 and config["head_dim"] == 16
    assert config["format"] == 2  # the graph takes each row's lengths
    assert config["inputs"][:5] == ["input_ids", "input_lengths", "past_lengths",
                                    "past_key_values.0.key", "past_key_values.0.value"]
    assert config["outputs"][:2] == ["logits", "present.0.key"]
    import onnx

    model = onnx.load(str(onnx_dir / "model.onnx"))
    onnx.checker.check_model(model)
    domains = {node.domain for node in model.graph.node}
    assert domains <= {"", "ai.onnx"}, f"custom-op domains left in the graph: {domains}"
    # The MLP's GELU as the model's: Erf for the exact one, Tanh for GPT-2's approximation.
    tanh = json.loads((ckpt / "config.json").read_text())["model"]["activation"] == "gelu_tanh"
    op_types = {node.op_type for node in model.graph.node}
    assert ("Tanh" in op_types, "Erf" in op_types) == (tanh, not tanh)


def test_logits_match_prefill_and_50_decode_steps(exported):
    ckpt, onnx_dir = exported
    onnx_model = run_onnx.OnnxGPT(str(onnx_dir))
    model, _ = pygpt.load(ckpt)
    ids = torch.randint(model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, cache = model.prefill(ids)
    logits, past = onnx_model.step(ids.numpy(), onnx_model.empty_past(2))
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=0)
    steps = 0
    while steps < 50:
        if cache.length == model.config.block_size:  # context full: start a new prefill
            ids = ids[:, -4:]
            with torch.no_grad():
                expected, cache = model.prefill(ids)
            logits, past = onnx_model.step(ids.numpy(), onnx_model.empty_past(2))
            np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=0)
        nxt = expected[:, -1].argmax(-1, keepdim=True)
        with torch.no_grad():
            expected = model.step(nxt, cache)  # extends the cache by one position
        logits, past = onnx_model.step(nxt.numpy(), past)
        np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=0)
        for (k, v), onnx_k, onnx_v in zip(cache.tensors(), past[0::2], past[1::2]):
            np.testing.assert_allclose(onnx_k, k.numpy(), atol=1e-5)
            np.testing.assert_allclose(onnx_v, v.numpy(), atol=1e-5)
        ids = torch.cat([ids, nxt], dim=1)
        steps += 1


def test_greedy_200_tokens_identical(exported):
    ckpt, onnx_dir = exported
    model, tokenizer = pygpt.load(ckpt)
    prompt = tokenizer.encode("ROMEO:")
    torch_tokens = model.generate(torch.tensor([prompt]), 200, sampling=Sampling(greedy=True))
    onnx_tokens = list(run_onnx.stream(run_onnx.OnnxGPT(str(onnx_dir)), np.array([prompt]), 200,
                                     greedy=True))
    assert [int(t[0]) for t in onnx_tokens] == torch_tokens[0, len(prompt):].tolist()


def test_int8_runs_and_stays_close(exported):
    ckpt, onnx_dir = exported
    fp32, int8 = run_onnx.OnnxGPT(str(onnx_dir)), run_onnx.OnnxGPT(str(onnx_dir), "int8")
    assert (onnx_dir / "model.int8.onnx").stat().st_size < 0.8 * (onnx_dir / "model.onnx").stat().st_size
    ids = np.array([fp32.tokenizer.encode("ROMEO:\nWhat")])
    logits32, _ = fp32.step(ids, fp32.empty_past(1))
    logits8, _ = int8.step(ids, int8.empty_past(1))
    # Quantized weights move the logits a little, not the model's predictions as a whole.
    probs32 = np.exp(logits32 - logits32.max(-1, keepdims=True))
    probs32 /= probs32.sum(-1, keepdims=True)
    probs8 = np.exp(logits8 - logits8.max(-1, keepdims=True))
    probs8 /= probs8.sum(-1, keepdims=True)
    assert np.abs(probs32 - probs8).sum(-1).max() < 0.2  # total variation distance x 2
    text = "".join(int8.tokenizer.decode(t.tolist()) for t in
                   run_onnx.stream(int8, ids, 50, greedy=True))
    assert len(text) == 50


def test_runner_needs_no_torch(exported, tmp_path):
    _, onnx_dir = exported
    env = torch_free_env(tmp_path)
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(onnx_dir), "--prompt",
                           "ROMEO:", "--max-new-tokens", "40", "--greedy"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ROMEO:") and len(done.stdout) >= 46
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True)
    assert probe.returncode != 0  # the blocker really blocks


def test_runner_rejects_unknown_prompt_characters(exported):
    _, onnx_dir = exported
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(onnx_dir), "--prompt",
                           "héllo ☃"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "'☃'" in done.stderr and "vocabulary" in done.stderr


def test_runner_refuses_a_folder_without_runner_config(exported, capsys):
    """A checkpoint folder (its config.json is no runner config), or an export made before the
    runner's config was named runner.json, is refused with a clear message."""
    ckpt, _ = exported
    with pytest.raises(SystemExit, match=rf"^error: .*no {RUNNER_CONFIG}: not a pygpt ONNX"):
        run_onnx.main(["--model", str(ckpt), "--prompt", "ROMEO:"])
    assert capsys.readouterr().out == ""


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint folder"):
        exporter.main(["--ckpt", str(tmp_path / "nope"), "--out", str(tmp_path / "onnx")])


def test_failed_export_leaves_no_file(exported, tmp_path, monkeypatch):
    ckpt, _ = exported
    out = tmp_path / "onnx"

    def disagree(*_args, **_kwargs):
        raise RuntimeError("exported model disagrees with PyTorch")

    monkeypatch.setattr(export_gpt, "_check_against_torch", disagree)
    with pytest.raises(RuntimeError, match="disagrees"):
        exporter.export(ckpt, out)
    assert not out.exists()  # not a file, nor the folder it created (and locked)


def test_read_only_out_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """An --out that cannot be written is named in one line, before any exporting, and stays
    as it was."""
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: refuse as the kernel refuses everyone else
        def denied(path):  # the folder's lock, the first file an export writes
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(run_folder, "_open_lock_file", denied)
    fixture = Path(__file__).resolve().parent / "fixtures" / "gpt-format1"
    with pytest.raises(SystemExit, match=r"^error: cannot write into the --out folder "
                                         r"\S*read-only: Permission denied$"):
        exporter.main(["--ckpt", str(fixture), "--out", str(out)])
    assert list(out.iterdir()) == [] and capsys.readouterr().out == ""


def test_export_prints_no_torchvision_notices(tmp_path):
    """The exporter's notices that torchvision (never exported) is missing are filtered out; in
    a fresh process, where they would be printed once per torchvision op."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "gpt-format1"
    done = subprocess.run([sys.executable, "-m", "pygpt.export", "--ckpt", str(fixture),
                           "--out", str(tmp_path / "onnx")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert "torchvision" not in done.stderr and "wrote" in done.stdout


def test_runner_batch_prints_what_each_prompt_gives_alone(exported, capsys):
    """pygpt-run with several --prompt: one batch, each text what it gives alone (greedy and
    seeded), greedy what python -m pygpt.generate prints for the same prompts; 40 tokens slide
    the context (24) of every row, at different steps."""
    from pygpt import generate

    ckpt, onnx_dir = exported
    prompts = ["ROMEO:", "A", "First Citizen:"]

    def run(module, *flags, prompts=prompts):
        capsys.readouterr()
        module.main([*flags, "--max-new-tokens", "40",
                     *[arg for p in prompts for arg in ("--prompt", p)]])
        return capsys.readouterr().out

    for sampling in (["--greedy"], ["--temperature", "0.9", "--top-k", "20", "--seed", "3"]):
        batched = run(run_onnx, "--model", str(onnx_dir), *sampling)
        alone = [run(run_onnx, "--model", str(onnx_dir), *sampling, prompts=[p]) for p in prompts]
        assert batched == "".join(f"=== prompt {i + 1} ===\n{text}"
                                  for i, text in enumerate(alone))
    assert batched != run(run_onnx, "--model", str(onnx_dir), *sampling[:-2], "--seed", "4")
    greedy = run(run_onnx, "--model", str(onnx_dir), "--greedy")
    assert greedy == run(generate, "--ckpt", str(ckpt), "--greedy")
