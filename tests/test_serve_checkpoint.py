"""`python -m pygpt.serve --ckpt RUN` (a subprocess on a free loopback port, called over real
HTTP): completions equal what pygpt.generate gives for the same prompts, seed and settings;
POST /v1/attention gives exactly pygpt.inspect.attention_maps' probabilities for the text, of
one layer or all; bad attention requests are 400s naming the field; the playground in headless
Chromium draws the attention panel's heatmaps; and --int8 with a checkpoint, or a BERT whose
tokenizer cannot write a fill-mask prompt, is a one-line error. (BERT and translator
checkpoints: test_serve_checkpoint_tasks.py.)"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import pygpt
from pygpt.storage import checkpoint
from pygpt.families import build
from pygpt.config import ModelConfig, TrainConfig
from pygpt.decoding.sampling import Sampling
from pygpt.families import attention_maps
from pygpt.tokenizer import CharTokenizer
from pygpt.training import train
from serve_helpers import Server, chromium

N_LAYER, N_HEAD, BLOCK = 2, 2, 16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-ckpt")
    train(ModelConfig(block_size=BLOCK, n_layer=N_LAYER, n_head=N_HEAD, n_embd=16),
          TrainConfig(out=str(root / "ckpt"), max_iters=30, eval_interval=30, eval_iters=1,
                      batch_size=8, warmup_iters=2, lr=1e-2), progress=False)
    return root / "ckpt"


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    s = Server(ckpt, tmp_path_factory.mktemp("ckpt-server"), "--max-batch", "4",
               "--queue-size", "4", "--threads", "1", source="--ckpt")
    yield s
    s.stop()


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.9, seed=5)],
                         ids=["greedy", "seeded"])
def test_completions_equal_pygpt_generate(server, ckpt, settings):
    model, tokenizer = pygpt.load(ckpt)
    prompts = ["First", "Be"]
    sampling = (Sampling(greedy=True) if settings["temperature"] == 0
                else Sampling(temperature=settings["temperature"]))
    generators = (None if "seed" not in settings
                  else [torch.Generator().manual_seed(settings["seed"]) for _ in prompts])
    expected = model.generate_batch([tokenizer.encode(p) for p in prompts], 30,
                                    sampling=sampling, generator=generators)
    body = {"prompt": prompts, "max_tokens": 30, **settings}
    got = server.client.post("/v1/completions", json=body).json()
    for choice, prompt, ids in zip(got["choices"], prompts, expected):
        assert choice["text"] == tokenizer.decode(ids[len(prompt):].tolist()), prompt


@pytest.mark.parametrize("layer", [None, 1])
def test_attention_equals_attention_maps(server, ckpt, layer):
    model, tokenizer = pygpt.load(ckpt)
    text = "First Citizen"
    maps = attention_maps(model, tokenizer, [text])[0]
    got = server.client.post("/v1/attention", json={"text": text, **(
        {} if layer is None else {"layer": layer})}).json()
    assert got["tokens"] == list(maps.tokens) and got["target_tokens"] == []
    assert (got["parts"], got["n_head"]) == ({"self": N_LAYER}, N_HEAD)
    layers = range(N_LAYER) if layer is None else [layer]
    assert [(entry["part"], entry["layer"]) for entry in got["layers"]] == [
        ("self", i) for i in layers]
    for entry in got["layers"]:
        expected = maps.layers("self")[entry["layer"]].probs.numpy()
        assert np.array(entry["probs"], dtype=np.float32).shape == (N_HEAD, len(text), len(text))
        np.testing.assert_array_equal(np.array(entry["probs"], dtype=np.float32), expected)
    assert server.client.get("/health").json()["attention"] == {
        "parts": {"self": N_LAYER}, "heads": N_HEAD, "max_tokens": BLOCK}


@pytest.mark.parametrize("body, field", [
    ({"text": "x" * (BLOCK + 1)}, "text"),  # longer than the maps may cover
    ({"text": "§"}, "text"),  # a character the char model lacks
    ({"text": ""}, "text"),
    ({"text": "First", "layer": N_LAYER}, "layer"),
    ({"text": "First", "layer": -1}, "layer"),
    ({"text": "First", "layer": "0"}, "layer"),
    ({"text": 3}, "text"),
    ({"text": "First", "heads": 2}, "heads"),
    ({"text": "First", "part": "cross"}, "part"),  # a translator's
    ({"text": "First", "target": "Second"}, "target"),
])
def test_bad_attention_requests_are_400_naming_the_field(server, body, field):
    r = server.client.post("/v1/attention", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.json()
    assert server.client.get("/health").status_code == 200


def test_playground_draws_the_attention_panel(server):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with chromium() as browser:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(
            lambda b: b.find_element(By.ID, "attention").is_displayed())
        box = browser.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys("First Citizen")
        Select(browser.find_element(By.ID, "attn-layer")).select_by_value("1")
        browser.find_element(By.ID, "attend").click()
        # Choosing the layer draws too: wait until the last drawing stands (earlier ones'
        # elements go stale as it replaces them).
        expected = [f"layer 1, head {h}" for h in range(N_HEAD)]
        WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda b: [c.text for c in b.find_elements(By.CSS_SELECTOR, "#attn-maps figcaption")]
            == expected)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#attn-maps canvas")) == N_HEAD
        # Pixels were drawn: the first query sees only itself, a full-weight (dark) cell.
        first = browser.execute_script(
            "const c = document.querySelector('#attn-maps canvas');"
            "return Array.from(c.getContext('2d').getImageData(29, 29, 1, 1).data);")
        assert first[:3] == [74, 123, 208], first
        assert browser.find_element(By.ID, "error").text == ""
        shot = os.environ.get("PYGPT_ATTENTION_PLAYGROUND_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)


def test_checkpoint_errors_are_one_line(ckpt, tmp_path):
    def serve(*argv):
        return subprocess.run([sys.executable, "-m", "pygpt.serve", *argv, "--port", "0"],
                              capture_output=True, text=True, timeout=120)
    done = serve("--ckpt", str(ckpt), "--int8")
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [
        "error: --int8 is for an export (--model); a checkpoint is served as it was saved"]
    bert, tokenizer = tmp_path / "bert", CharTokenizer.from_text("ab ")  # no [MASK]
    checkpoint.save(bert, build(ModelConfig(arch="bert", vocab_size=tokenizer.vocab_size,
                                            block_size=8, n_layer=1, n_head=2, n_embd=8)),
                    tokenizer)
    done = serve("--ckpt", str(bert))
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [
        "error: the tokenizer has no [CLS], [SEP], [MASK] token(s): fill-mask prompts need "
        "[CLS], [SEP], [MASK] (a BERT's tokenizer has them)"]
    done = serve("--ckpt", str(tmp_path / "missing"))
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("error:")
    done = serve("--ckpt", str(ckpt), "--model", str(ckpt))
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_a_seed_past_64_bits_is_a_400_and_the_worker_serves_on(server):
    r = server.client.post("/v1/completions", json={"prompt": "<", "max_tokens": 3,
                                                     "seed": 2 ** 64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    for seed in (2 ** 64 - 1, 0):
        r = server.client.post("/v1/completions", json={"prompt": "First", "max_tokens": 3,
                                                         "seed": seed}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert server.client.get("/health").json()["status"] == "ok"


@pytest.fixture
def in_process(ckpt, monkeypatch):
    """The checkpoint's app, called in this process, and its attention part."""
    from fastapi.testclient import TestClient

    from pygpt.serve.checkpoint import open_checkpoint
    from pygpt_runtime.serve.app import create_app
    from pygpt_runtime.serve.served import Limits

    served = open_checkpoint(str(ckpt), Limits())
    with TestClient(create_app(served)) as client:
        yield client, served.parts["attention"][0].__self__


def test_attention_answers_are_bounded_in_size_and_number(in_process, monkeypatch):
    from pygpt.serve import attention as served_attention

    client, attention = in_process
    monkeypatch.setattr(served_attention, "MAX_ATTENTION_NUMBERS", 2 * N_HEAD * 25 - 1)
    r = client.post("/v1/attention", json={"text": "First"})  # 2 layers x 2 heads x 5 x 5
    assert r.status_code == 400 and r.json()["error"]["param"] == "layer", r.text
    assert "ask for one layer or part" in r.json()["error"]["message"]
    assert client.post("/v1/attention", json={"text": "First", "layer": 1}).status_code == 200
    attention.in_flight = served_attention.IN_FLIGHT  # that many being made or sent
    r = client.post("/v1/attention", json={"text": "First", "layer": 1})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    attention.in_flight -= 1
    assert client.post("/v1/attention", json={"text": "First", "layer": 1}).status_code == 200
    assert attention.in_flight == served_attention.IN_FLIGHT - 1  # each answer freed its place
