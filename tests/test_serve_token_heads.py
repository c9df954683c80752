"""The server's routes of the BERT heads that read each token: POST /v1/tag (an entity tagger)
and POST /v1/answer (a question answerer), served from an export (pygpt-serve --model, torch
blocked) and from a checkpoint (python -m pygpt.serve --ckpt), each a subprocess on a free
loopback port called over real HTTP. Each route answers what its command prints for the same
input (python -m pygpt.tag --text, python -m pygpt.answer --question --context), a text longer
than the model's window and unanswerable questions included; bad requests are 400s naming the
field; a checkpoint's attention maps read a question answerer's pair as the model does (segment
B after the first [SEP]); and the playground in headless Chromium highlights the entities in the
text and the answer in its context, and draws the attention of both."""
import copy

import numpy as np
import pytest
import torch

import pygpt
import pygpt.answer
import pygpt.tag
from pygpt import export as exporter
from pygpt.families import attention_maps
from pygpt_runtime.answering import Prediction, answer_lines
from pygpt_runtime.tagging import entity_lines
from serve_helpers import Server, chromium
from test_answer import answerer  # noqa: F401  (the tiny answerer)
from test_export_token_heads import CONTEXT, QUESTIONS, TEXTS
from test_tag import run, tagger  # noqa: F401  (the tiny tagger)

SOURCES = ("--model", "--ckpt")
SHORT_CONTEXT = "The Rhine rises in the Swiss Alps and flows north to the North Sea."


@pytest.fixture(scope="module")
def servers(tagger, answerer, tmp_path_factory):  # noqa: F811
    """{(task, source): (checkpoint, server)}: each head served from its fp32 export and from
    its checkpoint."""
    root = tmp_path_factory.mktemp("serve-heads")
    started = {}
    try:
        for task, ckpt in (("tag", tagger), ("qa", answerer)):
            exporter.export(ckpt, root / task)
            for source in SOURCES:
                folder = root / task if source == "--model" else ckpt
                started[task, source] = (ckpt, Server(
                    folder, tmp_path_factory.mktemp("server"), "--threads", "1",
                    "--queue-size", "4", source=source))
        yield started
    finally:
        for _, server in started.values():
            assert "Traceback" not in server.stop()[1]


def prediction(body: dict) -> Prediction:
    """The route's answer as the runners' Prediction (no answer: "", -1, -1)."""
    given = body["answer"] is not None
    return Prediction(body["answer"] if given else "", body["start"] if given else -1,
                      body["end"] if given else -1, body["score"], body["null_score"])


@pytest.mark.parametrize("source", SOURCES)
def test_tag_route_equals_the_command(servers, source):
    ckpt, server = servers["tag", source]
    health = server.client.get("/health").json()
    assert health["task"] == "tag" and "O" in health["labels"]
    found_any = False
    for text in TEXTS:
        response = server.client.post("/v1/tag", json={"text": text})
        assert response.status_code == 200, response.text
        entities = response.json()["entities"]
        for e in entities:
            assert e["text"] == text[e["start"]:e["end"]] and f"B-{e['type']}" in health["labels"]
        found = [(e["type"], e["start"], e["end"]) for e in entities]
        found_any |= bool(found)
        expected = run(pygpt.tag.main, ["--ckpt", str(ckpt), "--text", text])
        assert "\n".join(entity_lines(text, found)) + "\n" == expected
    assert found_any, "the tiny tagger finds entities in these texts"


@pytest.mark.parametrize("source", SOURCES)
def test_answer_route_equals_the_command(servers, source):
    ckpt, server = servers["qa", source]
    assert server.client.get("/health").json()["labels"] == ["start", "end"]
    for flags in QUESTIONS:
        threshold = (float(flags[flags.index("--null-threshold") + 1])
                     if "--null-threshold" in flags else 0.0)
        body = {"question": flags[1], "context": flags[3], "no_answer": "--no-answer" in flags,
                "null_threshold": threshold}
        response = server.client.post("/v1/answer", json=body)
        assert response.status_code == 200, response.text
        found = prediction(response.json())
        expected = run(pygpt.answer.main, ["--ckpt", str(ckpt), *flags])
        assert "\n".join(answer_lines(found)) + "\n" == expected
        if found.text:
            assert flags[3][found.start:found.end] == found.text


def test_no_answer_is_null(servers):
    """A threshold far below [CLS]'s lead gives no answer: every span field null."""
    _, server = servers["qa", "--ckpt"]
    body = server.client.post("/v1/answer", json={
        "question": "Which city?", "context": CONTEXT, "no_answer": True,
        "null_threshold": -1e6}).json()
    assert (body["answer"], body["start"], body["end"]) == (None, None, None)
    assert body["null_score"] > body["score"] - 1e6


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("route, body, field, message", [
    ("/v1/tag", {"text": " \n "}, "text", "text must not be blank"),
    ("/v1/tag", {"text": ""}, "text", None),
    ("/v1/tag", {"text": 5}, "text", None),
    ("/v1/tag", {"text": "x", "top_k": 2}, "top_k", None),
    ("/v1/tag", '{"text": "x\\ud800"}', "text", "valid string"),  # a lone surrogate, as JSON allows
    ("/v1/answer", {"question": "Why?"}, "context", None),
    ("/v1/answer", {"question": "Why?", "context": "  "}, "context", "context must not be blank"),
    ("/v1/answer", {"question": "\t", "context": "x"}, "question", "question must not be blank"),
    ("/v1/answer", {"question": "Why?", "context": "x", "null_threshold": "1"},
     "null_threshold", None),
    ("/v1/answer", {"question": " ".join(["why"] * 40), "context": "x"}, "question",
     "leave no room for the context"),
])
def test_bad_requests_name_the_field(servers, source, route, body, field, message):
    task = "tag" if route == "/v1/tag" else "qa"
    _, server = servers[task, source]
    response = (server.client.post(route, json=body) if isinstance(body, dict) else
                server.client.post(route, content=body,
                                   headers={"Content-Type": "application/json"}))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field
    if message:
        assert message in error["message"]


def test_other_tasks_routes_are_not_served(servers):
    _, tagging = servers["tag", "--model"]
    _, answering = servers["qa", "--model"]
    assert tagging.client.post("/v1/answer", json={"question": "a", "context": "b"}
                               ).status_code == 404
    assert answering.client.post("/v1/tag", json={"text": "a"}).status_code == 404
    assert tagging.client.post("/v1/classify", json={"text": "a"}).status_code == 404
    assert tagging.client.post("/v1/attention", json={"text": "a"}).status_code == 404


def maps_equal(answer: dict, expected) -> None:
    """The route's maps are attention_maps' (every layer, part self)."""
    assert answer["tokens"] == list(expected.tokens)
    for got in answer["layers"]:
        np.testing.assert_allclose(got["probs"], expected.layers("self")[got["layer"]].probs,
                                   rtol=1e-5, atol=1e-6)


def test_tagger_attention_equals_attention_maps(servers):
    ckpt, server = servers["tag", "--ckpt"]
    model, tokenizer = pygpt.load(ckpt)
    text = TEXTS[0]
    answer = server.client.post("/v1/attention", json={"text": text}).json()
    maps_equal(answer, attention_maps(model, tokenizer, [text])[0])


def test_answerer_attention_reads_the_pair_as_the_model_does(servers):
    """"question [SEP] context" is read with segment B after the [SEP]: a copy of the model whose
    segment B embedding is its segment A one changes the pair's maps, not a single text's."""
    ckpt, server = servers["qa", "--ckpt"]
    model, tokenizer = pygpt.load(ckpt)
    pair, single = f"Where does the Rhine rise? [SEP] {SHORT_CONTEXT}", SHORT_CONTEXT
    answer = server.client.post("/v1/attention", json={"text": pair}).json()
    assert answer["tokens"].count("[SEP]") == 2
    maps_equal(answer, attention_maps(model, tokenizer, [pair])[0])
    one_segment = copy.deepcopy(model)
    with torch.no_grad():
        one_segment.embed.seg.weight[1] = one_segment.embed.seg.weight[0]
    for text, differs in ((pair, True), (single, False)):
        a, b = (attention_maps(m, tokenizer, [text])[0].layers("self")[0].probs
                for m in (model, one_segment))
        assert (not np.allclose(a, b, atol=1e-6)) == differs


def test_playground_highlights_entities_and_answers(servers):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def marks(browser, box):
        """The box's text without the marks' type labels, and each mark's [type, start, end,
        words] in that text."""
        return browser.execute_script("""
            const box = document.getElementById(arguments[0]);
            let plain = "";
            const out = [];
            for (const node of box.childNodes) {
              const words = node.nodeName === "MARK" ? node.firstChild.textContent
                                                     : node.textContent;
              if (node.nodeName === "MARK") {
                out.push([node.dataset.kind, plain.length, plain.length + words.length, words]);
              }
              plain += words;
            }
            return [plain, out];""", box)

    def drawn(browser):
        WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda b: len(b.find_elements(By.CSS_SELECTOR, "#attn-maps canvas")) == 2)

    with chromium() as browser:
        # The tagger: its entities marked in the text, typed, at their characters.
        _, server = servers["tag", "--ckpt"]
        text = TEXTS[0]
        expected = server.client.post("/v1/tag", json={"text": text}).json()["entities"]
        assert expected
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "tag").is_displayed())
        box = browser.find_element(By.ID, "tag-text")
        box.clear()
        box.send_keys(text)
        browser.find_element(By.ID, "tag-go").click()
        WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#tagged mark"))
        plain, found = marks(browser, "tagged")
        assert plain == text
        assert found == [[e["type"], e["start"], e["end"], e["text"]] for e in expected]
        labels = browser.find_elements(By.CSS_SELECTOR, "#tagged mark .kind")
        assert [label.text for label in labels] == [e["type"] for e in expected]
        browser.find_element(By.ID, "attend").click()
        drawn(browser)
        assert browser.find_element(By.ID, "error").text == ""

        # The answerer: the answer marked in its context; its attention over the pair.
        _, server = servers["qa", "--ckpt"]
        question = "Where does the Rhine rise?"
        expected = server.client.post("/v1/answer", json={
            "question": question, "context": SHORT_CONTEXT}).json()
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "qa").is_displayed())
        for box, value in (("qa-question", question), ("qa-context", SHORT_CONTEXT)):
            browser.find_element(By.ID, box).clear()
            browser.find_element(By.ID, box).send_keys(value)
        browser.find_element(By.ID, "answer-go").click()
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "answer-note").text)
        plain, found = marks(browser, "answered")
        assert plain == SHORT_CONTEXT
        assert found == [["answer", expected["start"], expected["end"], expected["answer"]]]
        assert browser.find_element(By.ID, "answer-note").text.startswith(
            f"score {expected['score']:.4f}")
        browser.find_element(By.ID, "attend").click()
        drawn(browser)
        assert browser.find_element(By.ID, "attn-heading").text == \
            "Attention of the question and its context"
        assert browser.find_element(By.ID, "error").text == ""
