"""The GPT's exported graph runs rows of different lengths in one call (runner.json format 2):
for every position encoding, a right-padded prefill and decode steps of rows at different
positions match PyTorch's batched decoding (prefill with lengths, then steps on its KV cache) on
every real position, and the present holds each row's real keys and values first.
The runner then decodes prompts of different lengths as one batch, one graph call per step,
each row giving the tokens it gives alone (greedy and seeded sampling, across window slides)
and those of pygpt's own batched decoding; an export of format 1, made before, still runs."""
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import pygpt
from helpers import TINY, make_model
from serve_helpers import CountingSession
from pygpt.decoding.sampling import Sampling
from pygpt.onnx import gpt as export_gpt
from pygpt.tokenizer import CharTokenizer
from pygpt_runtime import run_onnx

ort = pytest.importorskip("onnxruntime")

ENCODINGS = {
    "learned": {}, "sinusoidal": {}, "rotary": dict(rotary_dim=8), "none": {},
    "relative": dict(max_distance=3),  # distances past max_distance share the edge columns
    "alibi": dict(n_head=4, n_embd=32),
}
CHARS = [chr(ord("a") + i) for i in range(TINY.vocab_size)]


def _model(encoding: str):
    cfg = dataclasses.replace(TINY, pos_encoding=encoding, **ENCODINGS[encoding])
    return make_model(cfg, spread=0.3).eval()


@pytest.fixture(scope="module", params=list(ENCODINGS))
def exported(request, tmp_path_factory):
    """(model, export folder) of a tiny GPT with each position encoding."""
    model = _model(request.param)
    folder = tmp_path_factory.mktemp(f"padded-{request.param}")
    export_gpt.export_gpt(model, CharTokenizer(CHARS), folder)
    return model, folder


def test_graph_matches_torch_on_padded_rows(exported):
    model, folder = exported
    onnx_model = run_onnx.OnnxGPT(str(folder))
    assert onnx_model.padded and json.loads((folder / "runner.json").read_text())["format"] == 2
    lengths = torch.tensor([5, 2, 9])
    ids = torch.randint(TINY.vocab_size, (3, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, cache = model.prefill(ids, lengths)
    logits, past = onnx_model.step(ids.numpy(), onnx_model.empty_past(3), lengths.numpy(),
                                   np.zeros(3, dtype=np.int64))
    held = lengths.clone()
    for step in range(TINY.block_size - 9):
        for b in range(3):
            n_new = ids.shape[1] if step == 0 else 1
            real = min(n_new, int(lengths[b]))
            np.testing.assert_allclose(logits[b, :real], expected[b, :real].numpy(), atol=1e-4,
                                       rtol=0, err_msg=f"step {step} row {b}")
            for (k, v), onnx_k, onnx_v in zip(cache.tensors(), past[0::2], past[1::2]):
                n = int(held[b])
                np.testing.assert_allclose(onnx_k[b, :, :n], k[b, :, :n].numpy(), atol=1e-5)
                np.testing.assert_allclose(onnx_v[b, :, :n], v[b, :, :n].numpy(), atol=1e-5)
        nxt = expected[torch.arange(3), (lengths - 1) if step == 0 else 0].argmax(-1)[:, None]
        with torch.no_grad():
            expected = model.step(nxt, cache)
        logits, past = onnx_model.step(nxt.numpy(), [t[:, :, :int(held.max())] for t in past],
                                       np.ones(3, dtype=np.int64), held.numpy())
        held += 1
        lengths = torch.ones(3, dtype=torch.long)


PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12], [7, 7, 1, 0, 2]]


def test_prompts_of_different_lengths_run_as_one_graph_call_per_step(exported):
    _, folder = exported
    onnx_model = run_onnx.OnnxGPT(str(folder))
    onnx_model.session = counter = CountingSession(onnx_model.session)
    steps = TINY.block_size - max(map(len, PROMPTS))  # no window slides yet
    list(run_onnx.stream(onnx_model, PROMPTS, steps, greedy=True))
    assert counter.runs == steps  # the prefill, then one decode call per step


@pytest.mark.parametrize("sampling", [dict(greedy=True), dict(temperature=0.9, top_k=10)],
                         ids=["greedy", "sampled"])
def test_batched_rows_give_what_each_prompt_gives_alone(exported, sampling):
    """40 tokens: every row's window slides past the context (16) at its own step."""
    _, folder = exported
    onnx_model = run_onnx.OnnxGPT(str(folder))
    rngs = [np.random.default_rng(seed) for seed in range(len(PROMPTS))]
    batched = np.stack(list(run_onnx.stream(onnx_model, PROMPTS, 40, rng=rngs, **sampling)), 1)
    for b, prompt in enumerate(PROMPTS):
        alone = list(run_onnx.stream(onnx_model, [prompt], 40,
                                     rng=np.random.default_rng(b), **sampling))
        assert batched[b].tolist() == [int(t[0]) for t in alone], f"row {b}"


def test_batched_rows_match_pygpt_batched_decoding(exported):
    """Within the context: past it, pygpt's rolling cache (rotary, relative, ALiBi, none)
    slides by one token where the runner restarts from the last half-context."""
    model, folder = exported
    steps = TINY.block_size - max(map(len, PROMPTS))
    expected = model.generate_batch(PROMPTS, steps, sampling=Sampling(greedy=True))
    got = np.stack(list(run_onnx.stream(run_onnx.OnnxGPT(str(folder)), PROMPTS, steps,
                                        greedy=True)), 1)
    for b, prompt in enumerate(PROMPTS):
        assert got[b].tolist() == expected[b][len(prompt):].tolist(), f"row {b}"


FORMAT1 = Path(__file__).resolve().parent / "fixtures" / "gpt-onnx-format1"
FORMAT1_CKPT = Path(__file__).resolve().parent / "fixtures" / "gpt-format1"


def test_format1_export_still_runs():
    """An export written before the length inputs (of the format 1 checkpoint fixture): its
    graph takes no lengths, and the runner decodes with it as before, greedily as PyTorch does."""
    onnx_model = run_onnx.OnnxGPT(str(FORMAT1))
    assert not onnx_model.padded and onnx_model.config["format"] == 1
    model, tokenizer = pygpt.load(FORMAT1_CKPT)
    prompt = tokenizer.encode("ab c")
    expected = model.generate(torch.tensor([prompt, prompt[::-1]]), 20,
                              sampling=Sampling(greedy=True))
    got = np.stack(list(run_onnx.stream(onnx_model, [prompt, prompt[::-1]], 20, greedy=True)), 1)
    assert got.tolist() == expected[:, len(prompt):].tolist()
    with pytest.raises(ValueError, match="format 1.*export again"):
        list(run_onnx.stream(onnx_model, [prompt, prompt[:2]], 2, greedy=True))


@pytest.mark.parametrize("change, message", [
    (dict(format=3), "format must be one of 1, 2"),
    (dict(format="2"), "format must be one of 1, 2"),
    (dict(format=2), "format 2 graph takes the inputs input_lengths, past_lengths"),
])
def test_format_must_fit_the_graph_inputs(tmp_path, change, message):
    folder = tmp_path / "onnx"
    shutil.copytree(FORMAT1, folder)
    config = json.loads((folder / "runner.json").read_text())
    (folder / "runner.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        run_onnx.OnnxGPT(str(folder))
