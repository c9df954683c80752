"""Log-probabilities, echo and n choices on both servers (an export's, torch-free, and a
checkpoint's, on one trained GPT): each token's log-probability is the model's own (log-softmax
of its logits, whatever the sampling), equal to the checkpoint's torch model's; the top
alternatives are the most likely tokens, best first; the token texts join to the choice's text
at their offsets; with echo, the prompt's text and tokens come first (its first token scored by
nothing); streamed chunks carry the entries the whole answer has; a stop sequence drops the
tokens after it; and choice i of a prompt draws what a request with seed + i draws alone."""
import numpy as np
import pytest
import torch

import pygpt
from serve_helpers import Server, events, tiny_gpt

PROMPT = "First"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_gpt(tmp_path_factory.mktemp("logprobs"))


@pytest.fixture(scope="module", params=["--model", "--ckpt"])
def server(request, ckpt, tmp_path_factory):
    folder = ckpt.parent / "onnx" if request.param == "--model" else ckpt
    s = Server(folder, tmp_path_factory.mktemp("blocked"), "--max-batch", "4",
               source=request.param)
    yield s
    assert "Traceback" not in s.stop()[1]


def log_softmax(ckpt, text):
    """The torch model's next-token log-probabilities (len(text), vocab) after each prefix."""
    model, tokenizer = pygpt.load(ckpt)
    with torch.inference_mode():
        logits = model(torch.tensor([tokenizer.encode(text)])).logits[0]
    return logits.double().log_softmax(-1).numpy(), tokenizer


def complete(server, **body):
    answer = server.client.post("/v1/completions", json={"prompt": PROMPT, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def check_scores(ckpt, text, lp, n):
    """lp's entries, the last tokens of text, are the model's scores, with its n best."""
    logp, tokenizer = log_softmax(ckpt, text)
    ids = tokenizer.encode(text)
    assert "".join(lp["tokens"]) == text[len(text) - len("".join(lp["tokens"])):]
    for k, (token, got, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"],
                                              lp["top_logprobs"])):
        t = len(ids) - len(lp["tokens"]) + k  # the token's place in text
        assert token == tokenizer.decode([ids[t]])
        if t == 0:
            assert got is None and top is None
            continue
        assert got == pytest.approx(logp[t - 1, ids[t]], abs=1e-4)
        best = np.argsort(-logp[t - 1])[:n]
        assert list(top) == [tokenizer.decode([i]) for i in best]
        assert list(top.values()) == pytest.approx(logp[t - 1, best], abs=1e-4)


def test_logprobs_are_the_models_own(server, ckpt):
    got = complete(server, max_tokens=8, temperature=0.9, seed=3, logprobs=3)
    choice = got["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == 8
    assert lp["text_offset"] == list(range(8))  # a char model: one character a token
    check_scores(ckpt, PROMPT + choice["text"], lp, 3)
    assert got["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}


def test_echo_gives_the_prompt_and_its_scores_first(server, ckpt):
    plain = complete(server, max_tokens=6, temperature=0)["choices"][0]["text"]
    echoed = complete(server, max_tokens=6, temperature=0, echo=True)["choices"][0]
    assert echoed["text"] == PROMPT + plain and echoed["logprobs"] is None
    scored = complete(server, max_tokens=6, temperature=0, echo=True, logprobs=2)["choices"][0]
    lp = scored["logprobs"]
    assert scored["text"] == PROMPT + plain and lp["text_offset"] == list(range(11))
    check_scores(ckpt, PROMPT + plain, lp, 2)
    assert lp["token_logprobs"][0] is None
    greedy = lp["token_logprobs"][len(PROMPT):]  # greedy: each drawn token is the best
    assert greedy == [max(top.values()) for top in lp["top_logprobs"][len(PROMPT):]]


def test_streamed_chunks_carry_what_the_whole_answer_has(server):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 1, "echo": True,
            "stream": True}
    whole = complete(server, **{**body, "stream": False})["choices"][0]
    with server.client.stream("POST", "/v1/completions", json=body) as response:
        chunks = [e["choices"][0] for e in events(response)[:-1]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert sum((c["logprobs"][key] for c in chunks), []) == whole["logprobs"][key]


def test_a_stop_sequence_drops_the_tokens_after_it(server):
    whole = complete(server, max_tokens=12, temperature=0, logprobs=0)["choices"][0]
    stop = whole["text"][4:6]
    cut = complete(server, max_tokens=12, temperature=0, logprobs=0, stop=stop)["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == whole["text"][:whole["text"].find(stop)]
    assert "".join(cut["logprobs"]["tokens"]) == cut["text"]
    assert cut["logprobs"]["top_logprobs"] == [{}] * len(cut["text"])


def test_choice_i_draws_what_seed_plus_i_draws_alone(server):
    got = complete(server, prompt=[PROMPT, "Be"], n=2, max_tokens=12, temperature=1.0,
                   seed=2 ** 64 - 1)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    assert got["usage"]["prompt_tokens"] == 7 and got["usage"]["completion_tokens"] == 48
    for c, (prompt, seed) in zip(got["choices"], [(PROMPT, 2 ** 64 - 1), (PROMPT, 0),
                                                  ("Be", 2 ** 64 - 1), ("Be", 0)]):
        alone = complete(server, prompt=prompt, max_tokens=12, temperature=1.0, seed=seed)
        assert c["text"] == alone["choices"][0]["text"]
    assert got["choices"][0]["text"] != got["choices"][1]["text"]
