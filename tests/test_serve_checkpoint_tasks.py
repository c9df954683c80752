"""`python -m pygpt.serve --ckpt RUN` over a BERT (a masked-LM pretraining, a classifier of pairs)
and a translator checkpoint (a subprocess on a free loopback port, called over real HTTP): each
task route answers what its command line prints for the same input (pygpt.fill_mask,
pygpt.classify, pygpt.translate); POST /v1/attention gives exactly
pygpt.inspect.attention_maps' probabilities (BERT's self-attention over [CLS] text [SEP]; the
translator's encoder, decoder and cross-attention, cross maps target tokens by source tokens,
for a given target and for the model's greedy translation), rows summing to 1; bad requests and
another family's routes are 4xx JSON naming the field, never a 500; and the playground in
headless Chromium draws a translator's cross-attention heatmaps."""
import numpy as np
import pytest

import pygpt
import pygpt.classify
import pygpt.fill_mask
import pygpt.train
import pygpt.translate
from pygpt.storage import checkpoint
from pygpt.classify import classify_texts, load_classifier
from pygpt.fill_mask import fill_mask
from pygpt.families import attention_maps
from seq2seq_helpers import CFG as MT_CFG, reverser, tokenizer as mt_tokenizer
from serve_helpers import Server, chromium
from test_classify import run
from test_export_bert import pair_rows
from test_labelled_data import write

N_LAYER, N_HEAD, BLOCK = 2, 2, 32
SHAPE = ["--n-layer", str(N_LAYER), "--n-embd", "32", "--n-head", str(N_HEAD), "--block-size",
         str(BLOCK), "--batch-size", "8", "--eval-iters", "1", "--quiet"]
MASKED = "To be, or not to [MASK]: that is the [MASK]."


def serve(ckpt, tmp_path_factory):
    return Server(ckpt, tmp_path_factory.mktemp("ckpt-server"), "--max-batch", "4",
                  "--queue-size", "4", "--threads", "1", source="--ckpt")


@pytest.fixture(scope="module")
def mlm(text_file, tmp_path_factory):
    """A BERT pretrained a few steps (WordPiece), and its server."""
    ckpt = tmp_path_factory.mktemp("serve-mlm") / "ckpt"
    pygpt.train.main(["--arch", "bert", "--data", str(text_file), "--out", str(ckpt),
                      "--vocab-size", "300", "--max-iters", "4", "--eval-interval", "4", *SHAPE])
    server = serve(ckpt, tmp_path_factory)
    yield ckpt, server
    assert "Traceback" not in server.stop()[1]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A classifier of text pairs trained a few steps (char tokenizer), and its server."""
    root = tmp_path_factory.mktemp("serve-cls")
    data = write(root / "train.tsv", ("label", "text", "text_pair"), pair_rows(100, 1))
    pygpt.train.main(["--arch", "bert", "--task", "classify", "--tokenizer", "char", "--data",
                      str(data), "--out", str(root / "ckpt"), "--lr", "2e-3", "--max-iters", "8",
                      "--eval-interval", "8", *SHAPE])
    server = serve(root / "ckpt", tmp_path_factory)
    yield root / "ckpt", server
    assert "Traceback" not in server.stop()[1]


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """A translator trained a few dozen steps to reverse words (seq2seq_helpers), and its server."""
    ckpt = tmp_path_factory.mktemp("serve-mt") / "ckpt"
    checkpoint.save(ckpt, reverser(), mt_tokenizer())
    server = serve(ckpt, tmp_path_factory)
    yield ckpt, server
    assert "Traceback" not in server.stop()[1]


def test_fill_mask_equals_the_command(mlm):
    ckpt, server = mlm
    got = server.client.post("/v1/fill-mask", json={"text": MASKED, "top_k": 3}).json()["masks"]
    shown = "".join(f"[MASK] {n}: " + ", ".join(f"{c['token']!r} {c['score']:.3f}"
                                                for c in candidates) + "\n"
                    for n, candidates in enumerate(got, start=1))
    assert shown == run(pygpt.fill_mask.main, ["--ckpt", str(ckpt), "--text", MASKED,
                                                "--top-k", "3"])
    model, tokenizer = pygpt.load(ckpt)
    assert [[(c["token"], c["score"]) for c in candidates] for candidates in got] == \
        fill_mask(model, tokenizer, MASKED, 3)
    assert server.client.get("/health").json()["task"] == "fill-mask"


def test_classify_equals_the_command(classifier):
    ckpt, server = classifier
    text, pair = "a cat runs", "on the zebra"
    got = server.client.post("/v1/classify", json={"text": text, "text_pair": pair}).json()
    printed = run(pygpt.classify.main, ["--ckpt", str(ckpt), "--text", text, "--text-pair",
                                        pair]).splitlines()
    assert got["label"] == printed[0]
    assert [f"  {p['label']}: {p['probability']:.4f}" for p in got["probabilities"]] == \
        printed[1:]
    model, tokenizer, labels = load_classifier(str(ckpt))
    probs = classify_texts(model, tokenizer, labels, [text], [pair])[0].tolist()
    assert {p["label"]: p["probability"] for p in got["probabilities"]} == dict(zip(labels,
                                                                                   probs))
    assert server.client.get("/health").json()["labels"] == labels == ["no", "yes"]


@pytest.mark.parametrize("beam,penalty", [(1, 0.6), (3, 1.0)])
def test_translate_equals_the_command(translator, tmp_path, beam, penalty):
    ckpt, server = translator
    texts = ["abc de", "hgfedcba", "", "h"]
    got = server.client.post("/v1/translate", json={"text": texts, "beam": beam,
                                                    "length_penalty": penalty}).json()
    source = tmp_path / "src.txt"
    source.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    printed = run(pygpt.translate.main, ["--ckpt", str(ckpt), "--file", str(source), "--beam",
                                         str(beam), "--length-penalty", str(penalty)])
    assert "".join(t + "\n" for t in got["translations"]) == printed
    assert len(set(got["translations"])) == len(texts)  # answers that differ by sentence


def check_maps(got, maps, parts, layer=None):
    """got's layers are maps' probabilities exactly, each a (heads, queries, keys) array whose
    rows sum to 1."""
    assert got["tokens"] == list(maps.tokens)
    assert got["target_tokens"] == list(maps.target_tokens)
    layers = range(N_LAYER) if layer is None else [layer]
    assert [(e["part"], e["layer"]) for e in got["layers"]] == [(p, i) for p in parts
                                                                for i in layers]
    for entry in got["layers"]:
        probs = np.array(entry["probs"], dtype=np.float32)
        expected = maps.layers(entry["part"])[entry["layer"]]
        assert probs.shape == (N_HEAD, len(expected.query_tokens), len(expected.key_tokens))
        np.testing.assert_array_equal(probs, expected.probs.numpy())
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("layer", [None, 1])
def test_bert_attention_equals_attention_maps(mlm, layer):
    ckpt, server = mlm
    model, tokenizer = pygpt.load(ckpt)
    maps = attention_maps(model, tokenizer, [MASKED])[0]
    got = server.client.post("/v1/attention", json={"text": MASKED, **(
        {} if layer is None else {"layer": layer})}).json()
    check_maps(got, maps, ["self"], layer)
    assert got["tokens"][0] == "[CLS]" and got["tokens"][-1] == "[SEP]"
    assert "[MASK]" in got["tokens"]
    assert got["parts"] == {"self": N_LAYER} and got["n_head"] == N_HEAD
    assert server.client.get("/health").json()["attention"] == {
        "parts": {"self": N_LAYER}, "heads": N_HEAD, "max_tokens": BLOCK}


@pytest.mark.parametrize("target, part, layer", [
    (None, None, None),  # the model's greedy translation, every map
    ("edcba", "cross", None),
    ("ed", "decoder", 0),
    (None, "encoder", 1),
])
def test_translator_attention_equals_attention_maps(translator, target, part, layer):
    ckpt, server = translator
    model, tokenizer = pygpt.load(ckpt)
    text = "abcde"
    maps = attention_maps(model, tokenizer, [text], [target])[0]
    body = {"text": text, **{k: v for k, v in [("target", target), ("part", part),
                                                 ("layer", layer)] if v is not None}}
    got = server.client.post("/v1/attention", json=body).json()
    check_maps(got, maps, ["encoder", "decoder", "cross"] if part is None else [part], layer)
    assert got["target_tokens"][0] == "[BOS]" and len(got["target_tokens"]) > 1
    if target is not None:
        assert "".join(got["target_tokens"][1:]) == target
    for entry in got["layers"]:
        rows = len(got["target_tokens"] if entry["part"] != "encoder" else got["tokens"])
        columns = len(got["target_tokens"] if entry["part"] == "decoder" else got["tokens"])
        assert np.array(entry["probs"]).shape == (N_HEAD, rows, columns)
    assert server.client.get("/health").json()["attention"] == {
        "parts": {"encoder": MT_CFG.n_layer, "decoder": MT_CFG.n_layer,
                  "cross": MT_CFG.n_layer}, "heads": N_HEAD, "max_tokens": MT_CFG.block_size}


def refused(server, route, body, field, status=400):
    answer = server.client.post(route, json=body)
    assert answer.status_code == status, (body, answer.text)
    assert answer.json()["error"]["param"] == field, (body, answer.json())


@pytest.mark.parametrize("body, field", [
    ({"text": "the " * BLOCK}, "text"),  # past the positions with [CLS] and [SEP]
    ({"text": "a", "layer": N_LAYER}, "layer"),
    ({"text": "a", "part": "cross"}, "part"),  # a part BERT lacks
    ({"text": "a", "part": "heads"}, "part"),
    ({"text": "a", "target": "b"}, "target"),  # a target is a translator's
    ({"text": ""}, "text"),
])
def test_bad_bert_attention_requests(mlm, body, field):
    refused(mlm[1], "/v1/attention", body, field)


@pytest.mark.parametrize("body, field", [
    ({"text": "abc", "target": "xyz"}, "target"),  # characters the char model lacks
    ({"text": "abc", "target": "a" * MT_CFG.block_size}, "target"),  # [BOS] + it: too long
    ({"text": "a" * (MT_CFG.block_size + 1)}, "text"),
    ({"text": "abc", "part": "self"}, "part"),
    ({"text": "abc", "layer": MT_CFG.n_layer}, "layer"),
    ({"text": "abc", "target": ""}, "target"),
])
def test_bad_translator_attention_requests(translator, body, field):
    refused(translator[1], "/v1/attention", body, field)


def test_bad_task_requests_and_other_families_routes(mlm, classifier, translator):
    refused(mlm[1], "/v1/fill-mask", {"text": "no mask here"}, "text")
    refused(mlm[1], "/v1/fill-mask", {"text": "a [MASK] " * BLOCK}, "text")
    refused(classifier[1], "/v1/classify", {"text": " "}, "text")
    refused(classifier[1], "/v1/classify", {"text": "a", "text_pair": "\u2603"}, "text_pair")
    refused(translator[1], "/v1/translate", {"text": "abc", "beam": 7}, "beam")  # > vocabulary
    refused(translator[1], "/v1/translate", {"text": ["a"] * 5}, "text")  # past --max-batch
    refused(translator[1], "/v1/translate", {"text": "xyz"}, "text")
    for server, routes in [(mlm[1], ["/v1/classify", "/v1/translate", "/v1/completions"]),
                           (classifier[1], ["/v1/fill-mask", "/v1/translate"]),
                           (translator[1], ["/v1/fill-mask", "/v1/classify",
                                            "/v1/completions"])]:
        for route in routes:
            answer = server.client.post(route, json={"text": "a", "prompt": "a"})
            assert answer.status_code == 404 and "error" in answer.json(), route


def test_playground_draws_the_cross_attention(translator):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    server = translator[1]
    with chromium() as browser:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(
            lambda b: b.find_element(By.ID, "attention").is_displayed())
        assert Select(browser.find_element(By.ID, "attn-part")).first_selected_option.text == \
            "cross"
        browser.find_element(By.ID, "source").send_keys("abcde\nhgf")
        browser.find_element(By.ID, "attn-target").send_keys("edcba")
        Select(browser.find_element(By.ID, "attn-layer")).select_by_value("1")
        # Wait until the drawing of layer 1 stands (an earlier one's elements go stale).
        captions = [f"cross layer 1, head {h}" for h in range(N_HEAD)]
        WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda b: [c.text for c in b.find_elements(By.CSS_SELECTOR, "#attn-maps figcaption")]
            == captions)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#attn-maps canvas")) == N_HEAD
        expected = server.client.post("/v1/attention", json={
            "text": "abcde", "target": "edcba", "part": "cross", "layer": 1}).json()
        probs = expected["layers"][0]["probs"]
        rows, columns = len(expected["target_tokens"]), len(expected["tokens"])
        # Each cell's colour is its weight: target tokens down, source tokens across, below
        # the 28 pixels of the source tokens' names and right of the target tokens' names.
        cell = max(2, min(14, 180 // max(rows, columns)))
        cells = browser.execute_script("""
            const [rows, columns, cell] = arguments;
            return Array.from(document.querySelectorAll('#attn-maps canvas'), (c) => {
              const left = c.width - columns * cell, ctx = c.getContext('2d');
              const out = [left, c.height];
              for (let q = 0; q < rows; q++) for (let k = 0; k < columns; k++) out.push(
                ctx.getImageData(left + k * cell + 1, 28 + q * cell + 1, 1, 1).data[0]);
              return out;
            });""", rows, columns, cell)
        for h, drawn in enumerate(cells):
            assert drawn[0] >= 28 and drawn[1] == 28 + rows * cell
            assert drawn[2:] == [int(np.floor(255 - w * (255 - 74) + 0.5))  # Math.round
                                 for row in probs[h] for w in row]
        assert browser.find_element(By.ID, "error").text == ""
