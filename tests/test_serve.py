"""pygpt-serve over a GPT export (`python -m pygpt.serve`, started in a subprocess where `import
torch` fails, on a free loopback port, called over real HTTP): completions whole and streamed
equal what pygpt-run prints for the same prompt, seed and settings, also when many requests
decode together in one batch; stop sequences, usage counts, the `openai` client unchanged; every
bad request a 400 naming its field, an oversized body a 413, and the server serves on; a client
that leaves mid-stream frees its rows; a full queue answers 503 at once; the playground page in
headless Chromium streams a completion in; SIGTERM stops the server cleanly."""
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from pygpt_runtime import run_onnx
from serve_helpers import CountingSession, Server, chromium, events, tiny_gpt, wait_for

# The server's --max-batch, --queue-size, --max-body-bytes, --max-text-tokens.
BATCH, QUEUE, BODY, TEXT = 4, 4, 4096, 1000
LONG = 10 ** 7  # its --max-tokens: a completion that outlasts the test that starts it


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """A tiny char GPT (serve_helpers.tiny_gpt), exported."""
    return tiny_gpt(tmp_path_factory.mktemp("serve")).parent / "onnx"


@pytest.fixture(scope="module")
def server(export_dir, tmp_path_factory):
    s = Server(export_dir, tmp_path_factory.mktemp("blocked"), "--max-batch", str(BATCH),
               "--queue-size", str(QUEUE), "--max-tokens", str(LONG), "--max-body-bytes",
               str(BODY), "--max-text-tokens", str(TEXT))
    yield s
    s.stop()


def runner_text(export_dir, capsys, prompt, max_tokens, temperature=0.0, seed=None, top_k=None,
                top_p=None):
    """What pygpt-run prints after the prompt for the API's settings (temperature 0: --greedy)."""
    argv = ["--model", str(export_dir), "--prompt", prompt, "--max-new-tokens", str(max_tokens)]
    argv += ["--greedy"] if temperature == 0 else ["--temperature", str(temperature)]
    for flag, value in (("--seed", seed), ("--top-k", top_k), ("--top-p", top_p)):
        if value is not None:
            argv += [flag, str(value)]
    capsys.readouterr()
    run_onnx.main(argv)
    out = capsys.readouterr().out
    assert out.startswith(prompt) and out.endswith("\n")
    return out[len(prompt):-1]


SETTINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=3),
            dict(temperature=0.7, seed=11, top_k=5, top_p=0.9)]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(map(str, s.values())))
def test_completion_whole_and_streamed_equal_the_runner(server, export_dir, capsys, settings):
    expected = runner_text(export_dir, capsys, "First", 40, **settings)
    body = {"prompt": "First", "max_tokens": 40, **settings}
    whole = server.client.post("/v1/completions", json=body).json()
    assert whole["object"] == "text_completion" and whole["model"] == export_dir.name
    assert whole["choices"] == [{"index": 0, "text": expected, "logprobs": None,
                                 "finish_reason": "length"}]
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45}
    with server.client.stream("POST", "/v1/completions",
                              json={**body, "stream": True,
                                    "stream_options": {"include_usage": True}}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        got = events(response)
    assert got[-1] == "[DONE]" and got[-2]["usage"] == whole["usage"]
    chunks = [c["choices"][0] for c in got[:-2]]
    assert len(chunks) > 1 and all(c["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["finish_reason"] == "length"
    assert "".join(c["text"] for c in chunks) == expected


def test_requests_decoded_together_each_equal_the_runner(server, export_dir, capsys):
    """More rows than the batch holds (not more than it and the queue), of different prompt
    lengths and settings, at once; one request a list of prompts."""
    asks = [("First", dict(temperature=1.0, seed=s)) for s in range(2)]
    asks += [("Fir", dict(temperature=0.0)), ("Firs", dict(temperature=0.9, seed=7, top_k=3)),
             ("F", dict(temperature=1.0, seed=1))]
    assert len(asks) + 2 <= BATCH + QUEUE
    expected = [runner_text(export_dir, capsys, p, 30, **s) for p, s in asks]
    list_expected = [runner_text(export_dir, capsys, p, 30, temperature=1.0, seed=5)
                     for p in ("The", "First")]

    def ask(i):
        prompt, settings = asks[i]
        return server.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 30,
                                                           **settings})

    def ask_list():
        return server.client.post("/v1/completions", json={
            "prompt": ["The", "First"], "max_tokens": 30, "temperature": 1.0, "seed": 5})

    with ThreadPoolExecutor(len(asks) + 1) as pool:
        listing = pool.submit(ask_list)
        answers = list(pool.map(ask, range(len(asks))))
        listed = listing.result()
    for answer, text in zip(answers, expected):
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == text
    assert [c["text"] for c in listed.json()["choices"]] == list_expected
    assert [c["index"] for c in listed.json()["choices"]] == [0, 1]


def test_stop_sequences_cut_the_text(server, export_dir, capsys):
    full = runner_text(export_dir, capsys, "First", 40, temperature=1.0, seed=3)
    stop = full[12:14]
    cut = full[:full.find(stop)]
    body = {"prompt": "First", "max_tokens": 40, "temperature": 1.0, "seed": 3,
            "stop": ["\u00a7never", stop]}
    whole = server.client.post("/v1/completions", json=body).json()["choices"][0]
    assert (whole["text"], whole["finish_reason"]) == (cut, "stop")
    with server.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        chunks = [e["choices"][0] for e in events(r)[:-1]]
    assert "".join(c["text"] for c in chunks) == cut and chunks[-1]["finish_reason"] == "stop"


def test_openai_client_works_unchanged(server, export_dir, capsys):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [export_dir.name]
    expected = runner_text(export_dir, capsys, "First", 25, temperature=1.0, seed=2)
    done = client.completions.create(model=export_dir.name, prompt="First", max_tokens=25,
                                     temperature=1.0, seed=2)
    assert done.choices[0].text == expected and done.usage.completion_tokens == 25
    streamed = client.completions.create(model=export_dir.name, prompt="First", max_tokens=25,
                                         temperature=1.0, seed=2, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=export_dir.name, prompt="First", max_tokens=-1)


def test_zero_tokens_and_the_other_routes(server, export_dir):
    zero = server.client.post("/v1/completions", json={"prompt": "First", "max_tokens": 0})
    assert zero.json()["choices"][0]["text"] == ""
    assert zero.json()["choices"][0]["finish_reason"] == "length"
    health = server.client.get("/health").json()
    assert (health["status"], health["family"]) == ("ok", "gpt")
    schema = server.client.get("/openapi.json").json()
    assert {"/v1/completions", "/v1/models", "/health"} <= set(schema["paths"])
    assert "/v1/translate" not in schema["paths"]  # only the served family's routes
    page = server.client.get("/")
    assert page.status_code == 200 and "/playground/playground.js" in page.text
    assert "fetch(" in server.client.get("/playground/playground.js").text
    assert server.client.get("/nowhere").status_code == 404
    long = server.client.get("/" + "a" * 5_000)  # repeated no longer than a route's name
    assert long.status_code == 404 and len(long.content) < 2_000
    assert "/" + "a" * 99 + "…" in long.json()["error"]["message"]


def test_another_familys_route_is_a_404_naming_what_is_served(server, export_dir):
    answer = server.client.post("/v1/translate", json={"text": "a"})
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert message.startswith(f"no POST /v1/translate here: this server serves "
                              f"{export_dir.name}, a gpt model (generate), at ")
    assert "POST /v1/completions" in message and "GET /v1/models" in message
    assert "GET /health" in message and "/openapi.json" in message


BAD = [  # (body, the field the error names)
    ({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"), ({"prompt": ["ok", 3]}, "prompt[1]"),
    ({"prompt": "First", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "First", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "First", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "First", "max_tokens": LONG + 1}, "max_tokens"),
    ({"prompt": "First", "temperature": float("nan")}, "temperature"),  # JSON's NaN
    ({"prompt": "First", "temperature": float("inf")}, "temperature"),
    ({"prompt": "First", "temperature": "1"}, "temperature"),
    ({"prompt": "First", "temperature": -0.5}, "temperature"),
    ({"prompt": "First", "top_p": 0}, "top_p"), ({"prompt": "First", "top_p": 1.5}, "top_p"),
    ({"prompt": "First", "top_k": 0}, "top_k"), ({"prompt": "First", "seed": -1}, "seed"),
    ({"prompt": "First", "stream": "yes"}, "stream"), ({"prompt": "First", "stop": 3}, "stop"),
    ({"prompt": "First", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "First", "n": 0}, "n"), ({"prompt": "First", "n": BATCH + 1}, "n"),
    ({"prompt": ["a", "b"], "n": BATCH // 2 + 1}, "n"),  # prompts x n past --max-batch
    ({"prompt": "First", "logprobs": 6}, "logprobs"), ({"prompt": "a", "logprobs": -1}, "logprobs"),
    ({"prompt": "First", "echo": 1}, "echo"),
    ({"prompt": "a" * 17, "echo": True, "logprobs": 0}, "echo"),  # past the context (16)
    ({"prompt": "First", "colour": 1}, "colour"),
    ({"prompt": "First", "model": "other"}, "model"),
    ({"prompt": "Fir\u20acst"}, "prompt"),  # a character the char model does not know
    ({"prompt": "\ud800"}, "prompt"),  # not UTF-8
    ({"prompt": ["a"] * (BATCH + 1)}, "prompt"),
    ({"prompt": "a" * (TEXT + 1)}, "prompt"),  # past --max-text-tokens
    ({"prompt": "a" * BODY}, "body"),  # past --max-body-bytes
]


@pytest.mark.parametrize("body,field", BAD, ids=[f for _, f in BAD])
def test_bad_requests_are_4xx_naming_the_field(server, body, field):
    answer = server.client.post("/v1/completions", content=json.dumps(body),
                                headers={"Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and "Traceback" not in answer.text, error
    assert answer.status_code == (413 if field == "body" else 404 if field == "model" else 400)
    again = server.client.post("/v1/completions", json={"prompt": "First", "max_tokens": 2})
    assert again.status_code == 200


def test_bodies_that_are_not_json_or_lie_about_their_size(server):
    not_json = server.client.post("/v1/completions", content=b"{\"prompt\": ",
                                  headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["error"]["param"] == "body"

    def chunks():  # no Content-Length: the limit is counted as the body comes
        for _ in range(BODY // 100 + 2):
            yield b" " * 100
    streamed = server.client.post("/v1/completions", content=chunks(),
                                  headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and streamed.json()["error"]["param"] == "body"


def test_full_queue_is_503_at_once_and_a_client_leaving_frees_its_rows(server):
    leave = threading.Event()

    def read_until_leaving():  # a client streaming every row of the batch, reading along
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json={
                    "prompt": ["First"] * BATCH, "max_tokens": LONG, "stream": True}) as r:
                for _ in r.iter_lines():
                    if leave.is_set():
                        return  # mid-stream: the connection closes

    with ThreadPoolExecutor(2) as pool:
        reader = pool.submit(read_until_leaving)
        wait_for(server, active=BATCH)
        queued = pool.submit(server.client.post, "/v1/completions",
                             json={"prompt": ["Fir"] * QUEUE, "max_tokens": 3})
        wait_for(server, waiting=QUEUE)
        start = time.monotonic()
        refused = server.client.post("/v1/completions", json={"prompt": "First", "max_tokens": 3})
        assert refused.status_code == 503 and time.monotonic() - start < 5
        assert refused.json()["error"]["type"] == "overloaded_error"
        assert not queued.done()
        leave.set()
        reader.result(timeout=60)
        assert queued.result(timeout=60).status_code == 200
    wait_for(server, active=0, waiting=0)


def test_playground_streams_a_completion_in_headless_chromium(server, export_dir, capsys,
                                                              tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    expected = runner_text(export_dir, capsys, "First", 60, temperature=1.0, seed=4)
    with chromium() as browser:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "gpt").is_displayed())
        assert not browser.find_element(By.ID, "attention").is_displayed()  # an export: none
        for field, value in (("prompt", "First"), ("max_tokens", "60"), ("temperature", "1"),
                             ("seed", "4")):
            box = browser.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        browser.find_element(By.ID, "generate").click()
        generated = browser.find_element(By.ID, "generated")
        WebDriverWait(browser, 30).until(lambda b: generated.get_attribute("textContent")
                                         == expected)
        WebDriverWait(browser, 10).until(
            lambda b: b.find_element(By.ID, "generate").is_enabled())
        assert browser.find_element(By.ID, "error").text == ""
        shot = Path(os.environ.get("PYGPT_PLAYGROUND_SCREENSHOT", tmp_path / "playground.png"))
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0


def test_sigterm_stops_the_server_cleanly(export_dir, tmp_path):
    s = Server(export_dir, tmp_path, "--grace", "60")
    done = []
    streaming = threading.Thread(target=lambda: done.append(s.client.post(
        "/v1/completions", json={"prompt": "First", "max_tokens": 1500, "stream": True})))
    streaming.start()
    wait_for(s, active=1)
    status, err = s.stop(signal.SIGTERM)
    streaming.join(30)
    assert status == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert (f"pygpt-serve: serving {export_dir.name}, a gpt model (generate) at "
            f"http://127.0.0.1:{s.port}/; clients pass \"model\": \"{export_dir.name}\"\n") in err
    assert done and done[0].status_code == 200
    assert done[0].text.rstrip().endswith("data: [DONE]")  # the open stream finished


def test_streams_still_open_when_the_grace_ends_end_with_an_error_event(export_dir, tmp_path):
    s = Server(export_dir, tmp_path, "--grace", "1", "--max-batch", "1", "--max-tokens",
               str(LONG))
    with ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(s.client.post, "/v1/completions", json={
            "prompt": "First", "max_tokens": LONG, "stream": True}) for _ in range(2)]
        wait_for(s, active=1, waiting=1)  # one decodes, one waits its turn
        status, err = s.stop(signal.SIGTERM)
        answers = [stream.result(timeout=30) for stream in streams]
    assert status == 128 + signal.SIGTERM and "Traceback" not in err, err
    for answer in answers:
        got = events(answer)
        assert got[-1] == "[DONE]" and got[-2] == {"error": {
            "message": "the server is shutting down", "type": "server_error"}}, got[-3:]


def test_a_whole_completion_stops_when_its_client_leaves(server):
    with pytest.raises(httpx.ReadTimeout):
        server.client.post("/v1/completions", json={"prompt": "First", "max_tokens": LONG},
                           timeout=1)
    start = time.monotonic()
    wait_for(server, active=0, waiting=0)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("seed", [-1, 2 ** 64, 10 ** 30])
def test_a_seed_past_64_bits_is_a_400(server, seed):
    r = server.client.post("/v1/completions", json={"prompt": "First", "seed": seed})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    assert server.client.post("/v1/completions", json={
        "prompt": "First", "seed": 2 ** 64 - 1, "max_tokens": 2}).status_code == 200


def test_help_says_where_the_schema_is_and_what_to_call_the_model():
    from pygpt_runtime.serve import command

    text = command.parser().format_help()
    assert "schema is at /openapi.json" in text and "/docs page draws it" in text
    assert "loads from the\ninternet" in text and "its schema: /docs" not in text
    assert '"model", which the `openai` client must\npass, is that name' in text
    assert 'out/onnx/ serves "onnx"' in text


def _decode_together(model, prompts, max_tokens, seed):
    """The texts of the prompts decoded by one pygpt_runtime.serve.batcher.Batcher, submitted together."""
    from pygpt_runtime.serve.batcher import Batcher
    from pygpt_runtime.serve.workers import Generation

    texts, done = [""] * len(prompts), threading.Semaphore(0)

    def sender(b):
        def send(kind, payload, scored=None):
            assert kind != "error", payload
            texts[b] += payload
            if kind == "end":
                done.release()
        return send
    batcher = Batcher(model, queue_size=len(prompts), max_batch=len(prompts))
    try:
        batcher.submit([Generation(model.tokenizer.encode(p), max_tokens,
                                   dict(temperature=0.8), np.random.default_rng(seed + b),
                                   sender(b)) for b, p in enumerate(prompts)])
        for _ in prompts:
            assert done.acquire(timeout=60)
    finally:
        batcher.close()
    return texts


@pytest.mark.parametrize("old_format", [False, True], ids=["format2", "format1"])
def test_worker_runs_rows_of_different_lengths_in_one_call_per_step(export_dir, old_format):
    """Four prompts of different lengths submitted together: one graph call per step (a format
    1 export, whose graph takes no lengths: one per window length, as before), and each row's
    text what the runner gives its prompt alone with the same seed."""
    folder = Path(__file__).resolve().parent / "fixtures" / "gpt-onnx-format1"
    model = run_onnx.OnnxGPT(str(folder if old_format else export_dir))
    prompts = ["ab", "a bc", "hag", "c"] if old_format else ["First", "A", "Citizen:", "Be"]
    model.session = counter = CountingSession(model.session)
    steps = 5  # within every window: no slide
    texts = _decode_together(model, prompts, steps, seed=7)
    assert counter.runs == steps * (len(set(map(len, prompts))) if old_format else 1)
    for b, prompt in enumerate(prompts):
        tokens = run_onnx.stream(model, [model.tokenizer.encode(prompt)], steps, temperature=0.8,
                                 rng=np.random.default_rng(7 + b))
        assert texts[b] == model.tokenizer.decode([int(t[0]) for t in tokens]), prompt
