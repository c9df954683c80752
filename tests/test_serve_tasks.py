"""pygpt-serve over a BERT (fill-mask; classifier of pairs) and a translator export, started
where `import torch` fails: each route answers what pygpt-run prints for the same text and
settings, refuses bad requests with a 400 naming the field, and only the served family's routes
exist."""
import json
import subprocess

import pytest

from helpers import RUNNER_COMMAND
from pygpt.export import export
from pygpt.storage import checkpoint
from seq2seq_helpers import reverser, tokenizer
from serve_helpers import Server
from test_export_bert import classifier, mlm  # noqa: F401  (the tiny BERT exports)


def runner(*argv) -> str:
    return subprocess.run([*RUNNER_COMMAND, *map(str, argv)], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-mt")
    checkpoint.save(root / "ckpt", reverser(), tokenizer())
    export(root / "ckpt", root / "onnx")
    return root / "onnx"


def test_fill_mask_equals_the_runner(mlm, tmp_path):  # noqa: F811
    text = "To be, or not to [MASK]: that is the [MASK]."
    expected = runner("--model", mlm[1], "--text", text, "--top-k", 3)
    s = Server(mlm[1], tmp_path)
    try:
        masks = s.client.post("/v1/fill-mask", json={"text": text, "top_k": 3}).json()["masks"]
        shown = "".join(f"[MASK] {n}: " + ", ".join(f"{c['token']!r} {c['score']:.3f}"
                                                    for c in candidates) + "\n"
                        for n, candidates in enumerate(masks, start=1))
        assert shown == expected
        for body, field in [({"text": "no mask here"}, "text"), ({"text": 3}, "text"),
                            ({"text": "a [MASK]", "top_k": 0}, "top_k"), ({}, "text"),
                            ({"text": "a [MASK] " * 200}, "text")]:
            answer = s.client.post("/v1/fill-mask", json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == field, body
        other = s.client.post("/v1/classify", json={"text": "a"})
        assert other.status_code == 404
        assert other.json()["error"]["message"].startswith(
            f"no POST /v1/classify here: this server serves {mlm[1].name}, a bert model "
            "(fill-mask), at GET /health, POST /v1/fill-mask (")
        assert s.client.get("/health").json()["task"] == "fill-mask"
    finally:
        status, err = s.stop()
    assert "Traceback" not in err
    assert f"serving {mlm[1].name}, a bert model (fill-mask) at http://" in err
    assert "clients pass" not in err  # a BERT's requests name no model


def test_classify_equals_the_runner(classifier, tmp_path):  # noqa: F811
    text, pair = "a cat", "zebra"
    printed = runner("--model", classifier[1], "--text", text, "--text-pair", pair).splitlines()
    s = Server(classifier[1], tmp_path)
    try:
        got = s.client.post("/v1/classify", json={"text": text, "text_pair": pair}).json()
        assert got["label"] == printed[0]
        assert [f"  {p['label']}: {p['probability']:.4f}" for p in got["probabilities"]] == \
            printed[1:]
        for body, field in [({"text": " "}, "text"), ({"text": "a", "text_pair": 1}, "text_pair"),
                            ({"text": "\u2603"}, "text")]:  # a character the char model lacks
            answer = s.client.post("/v1/classify", json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == field, body
        assert s.client.post("/v1/fill-mask", json={"text": "a"}).status_code == 404
    finally:
        status, err = s.stop()
    assert "Traceback" not in err


@pytest.mark.parametrize("beam,penalty", [(1, 0.6), (3, 1.0)])
def test_translate_equals_the_runner(translator, tmp_path, beam, penalty):
    texts = ["abc de", "hgfedcba", "", "h"]
    s = Server(translator, tmp_path, "--max-batch", "4")
    try:
        got = s.client.post("/v1/translate", json={"text": texts, "beam": beam,
                                                   "length_penalty": penalty}).json()
        for text, translation in zip(texts, got["translations"]):
            expected = runner("--model", translator, "--text", text, "--beam", beam,
                              "--length-penalty", penalty)
            assert translation + "\n" == expected
        one = s.client.post("/v1/translate", json={"text": "abc", "beam": beam}).json()
        assert one["translations"] == [runner("--model", translator, "--text", "abc",
                                              "--beam", beam).rstrip("\n")]
        for body, field in [({"text": "abc", "beam": 0}, "beam"),
                            ({"text": "abc", "beam": 7}, "beam"),  # 2 * 7 tokens: more than the vocabulary
                            ({"text": "abc", "length_penalty": float("nan")},
                             "length_penalty"),
                            ({"text": "abc", "length_penalty": 1e4}, "length_penalty"),
                            ({"text": ["a"] * 5}, "text"), ({"text": "xyz"}, "text")]:
            answer = s.client.post("/v1/translate", content=json.dumps(body),
                                   headers={"Content-Type": "application/json"})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == field, body
    finally:
        status, err = s.stop()
    assert status == 143 and "Traceback" not in err
