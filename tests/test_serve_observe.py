"""What the server tells of its requests, in process (serve_helpers.app_client): the X-Request-Id
of every answer (the client's when sane), one log line per request on the "pygpt.serve" logger,
and GET /metrics in Prometheus' text format, on a registry of each app's own."""
import logging
import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from serve_helpers import app_client  # noqa: E402


def test_every_answer_has_a_request_id_and_a_log_line(caplog):
    caplog.set_level(logging.INFO, logger="pygpt.serve")
    with app_client() as c:
        given = c.get("/health", headers={"X-Request-Id": "client-id.42"})
        made = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 3})
        insane = [c.get("/health", headers={"X-Request-Id": value})
                  for value in ("has space", "x" * 129, "", "caf\u00e9".encode())]
        refused = [c.get("/nowhere"), c.post("/v1/completions", json={"prompt": 3})]
    assert given.headers["x-request-id"] == "client-id.42"
    for r in (made, *insane, *refused):
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), r.headers
    assert [r.status_code for r in refused] == [404, 400]
    lines = [r.getMessage() for r in caplog.records if r.name == "pygpt.serve"]
    assert len(lines) == 8
    assert re.fullmatch(r'request id=client-id\.42 method=GET path="/health" status=200 '
                        r'duration_ms=\d+\.\d', lines[0])
    assert re.fullmatch(rf'request id={made.headers["x-request-id"]} method=POST '
                        r'path="/v1/completions" status=200 duration_ms=\d+\.\d tokens=3',
                        lines[1])
    assert 'path="/nowhere" status=404' in lines[6] and "tokens" not in lines[6]
    assert 'path="/v1/completions" status=400' in lines[7]


def test_a_log_line_quotes_the_path_and_cuts_a_long_one(caplog):
    caplog.set_level(logging.INFO, logger="pygpt.serve")
    with app_client() as c:
        c.get("/a%0Aforged%20line%22")
        c.get("/" + "b" * 5000)
    lines = [r.getMessage() for r in caplog.records if r.name == "pygpt.serve"]
    assert 'path="/a\\nforged line\\"" status=404' in lines[0] and "\n" not in lines[0]
    assert f'path="/{"b" * 199}..." status=404' in lines[1]


def metrics(c) -> dict:
    """Each sample of /metrics by name and labels."""
    text = c.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_requests_tokens_and_their_latencies():
    with app_client() as c:
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 5}).status_code == 200
        with c.stream("POST", "/v1/completions",
                      json={"prompt": ["a", "b"], "max_tokens": 4, "stream": True}) as r:
            assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
        assert c.get("/nowhere/" + "x" * 500).status_code == 404
        assert c.post("/v1/completions", json={"prompt": 3}).status_code == 400
        m = metrics(c)
    assert m[("pygpt_requests_total", (("route", "/v1/completions"), ("status", "200")))] == 2
    assert m[("pygpt_requests_total", (("route", "/v1/completions"), ("status", "400")))] == 1
    assert m[("pygpt_requests_total", (("route", "(none)"), ("status", "404")))] == 1
    assert m[("pygpt_generated_tokens_total", ())] == 5 + 2 * 4
    assert m[("pygpt_time_to_first_token_seconds_count", ())] == 2
    assert m[("pygpt_time_per_token_seconds_count", ())] == (5 - 1) + 2 * (4 - 1)
    assert m[("pygpt_time_to_first_token_seconds_sum", ())] > 0
    assert m[("pygpt_queue_waiting", ())] == 0 and m[("pygpt_rows_active", ())] == 0


def test_each_app_has_its_own_registry():
    sample = ("pygpt_requests_total", (("route", "/health"), ("status", "200")))
    with app_client() as one, app_client() as two:
        one.get("/health")
        assert sample in metrics(one) and sample not in metrics(two)
