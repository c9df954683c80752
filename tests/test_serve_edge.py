"""pygpt-serve against slow and many clients, over real sockets (`python -m pygpt.serve`, torch
blocked, the format 1 GPT export of tests/fixtures): a client that trickles its headers, or sends
nothing, is cut with a 408 after --header-timeout, one that trickles its body after
--body-timeout; past --limit-concurrency connections a request is a 503 while /health still
answers, and past twice as many a connection is closed unread; bad HTTP and oversized headers
are JSON errors (431, 400); a Host that is not local is a 400; every request leaves one log line
(uvicorn's access log is off); bad values of the flags are one-line errors."""
import json
import socket
import time

import httpx
import pytest

from serve_helpers import FIXTURE_EXPORT, Server, command_error
HEADER_TIMEOUT, BODY_TIMEOUT, LIMIT = 3.0, 1.0, 2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(FIXTURE_EXPORT, tmp_path_factory.mktemp("blocked"), "--header-timeout",
               str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT), "--limit-concurrency",
               str(LIMIT), "--max-header-bytes", "4096", "--log-level", "info")
    yield s
    if s.process.returncode is None:
        s.stop()


def connect(server, first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port))
    if first:
        s.sendall(first)
    return s


def answer(s: socket.socket, within: float, trickle: bytes = b"") -> tuple[int, dict, float]:
    """The status and JSON body the server answers on s, and the seconds it took; while it has
    not answered, trickle is sent every 0.3 s."""
    start = time.monotonic()
    data = b""
    s.settimeout(0.3)
    while time.monotonic() - start < within:
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            if trickle:
                try:
                    s.sendall(trickle)
                except OSError:
                    pass
            continue
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), data
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body), time.monotonic() - start


def wait_served(server) -> None:
    """Until a completion is no longer refused for open connections."""
    deadline = time.monotonic() + 10
    while True:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
        if r.status_code == 200 or time.monotonic() > deadline:
            assert r.status_code == 200, r.text
            return
        time.sleep(0.2)


def test_slow_or_silent_headers_are_cut_after_the_header_timeout(server):
    wait_served(server)
    trickling = connect(server, b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
    silent = connect(server)
    status, body, took = answer(trickling, 10, trickle=b"X-Slow: 1\r\n")
    assert status == 408 and HEADER_TIMEOUT - 0.5 < took < HEADER_TIMEOUT + 3, took
    assert body["error"]["message"] == ("the request's headers did not arrive within the "
                                        "server's limit of 3 seconds")
    assert answer(silent, 5)[0] == 408


def test_a_slow_body_is_cut_after_the_body_timeout(server):
    wait_served(server)
    slow = connect(server, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                           b"X-Request-Id: slow-body-1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n{\"pr")
    status, body, took = answer(slow, 10, trickle=b" ")
    assert status == 408 and took < BODY_TIMEOUT + 3, took
    assert "request's body did not arrive within the server's limit of 1 seconds" in \
        body["error"]["message"]
    wait_served(server)


def one_response(s: socket.socket) -> bytes:
    """The head of the next response on s (its body read past, by its content-length)."""
    s.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, f"the server closed the connection ({data!r} read)"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")))
    while len(body) < length:
        body += s.recv(4096)
    return head


def test_a_body_finished_after_an_early_answer_keeps_the_connection(server):
    wait_served(server)
    s = connect(server, b"POST /nowhere HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n"
                        b"\r\n12345")
    assert one_response(s).startswith(b"HTTP/1.1 404")  # answered before the body's end
    s.sendall(b"67890")
    time.sleep(BODY_TIMEOUT + 0.5)  # past the body's deadline: the connection lives on
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert one_response(s).startswith(b"HTTP/1.1 200")
    s.close()


def test_past_the_connection_limit_requests_are_503_and_health_answers(server):
    wait_served(server)
    held = [connect(server) for _ in range(LIMIT)]
    time.sleep(0.3)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "overloaded_error"
    assert "as many connections as it takes (2)" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert httpx.get(server.url + "/metrics").status_code == 200
    held += [connect(server) for _ in range(LIMIT)]  # twice the limit now open
    time.sleep(0.3)
    past = connect(server)
    past.settimeout(HEADER_TIMEOUT / 2)
    try:
        assert past.recv(100) == b""  # closed unread, long before any timeout
    except ConnectionResetError:
        pass
    for s in held:
        assert answer(s, HEADER_TIMEOUT + 3)[0] == 408
    wait_served(server)  # the held connections gone, the server serves again


BIG = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n"


@pytest.mark.parametrize("parts, status, says", [
    ([BIG], 431, "line and headers pass the server's limit of 4096 bytes"),
    ([BIG[:3000], BIG[3000:]], 431, "line and headers pass the server's limit of 4096 bytes"),
    ([b"NOT HTTP AT ALL\r\n\r\n"], 400, "not valid HTTP/1.1")],
    ids=["big-headers", "big-headers-in-parts", "not-http"])
def test_bad_http_and_oversized_headers_are_json_errors(server, parts, status, says):
    s = connect(server, parts[0])
    for part in parts[1:]:
        time.sleep(0.2)
        s.sendall(part)
    answered, body, _ = answer(s, 5)
    assert answered == status and body["error"]["message"].endswith(says)


def test_a_host_that_is_not_local_is_refused(server):
    r = httpx.get(server.url + "/health", headers={"Host": "rebound.example"})
    assert r.status_code == 400 and "--allowed-hosts" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health", headers={"Host": "localhost:1"}).status_code == 200


def test_every_request_leaves_one_log_line_and_uvicorn_none(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 4},
                   headers={"X-Request-Id": "edge-test-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "edge-test-1"
    _, err = server.stop()
    line = [line for line in err.splitlines() if "id=edge-test-1" in line]
    assert len(line) == 1 and 'path="/v1/completions" status=200' in line[0]
    assert line[0].endswith("tokens=4") and line[0].startswith("INFO:")
    assert "refused status=408 reason=timeout" in err  # the headers that came too slowly
    body_cut = [line for line in err.splitlines() if "id=slow-body-1" in line]
    assert len(body_cut) == 1 and "status=408" in body_cut[0]  # not the app's 400 after it
    assert '"POST /v1/completions HTTP/1.1" 200' not in err  # uvicorn's access line
    assert "Traceback" not in err


@pytest.mark.parametrize("flags", [
    ["--header-timeout", "0"], ["--body-timeout", "-1"], ["--limit-concurrency", "0"],
    ["--timeout-keep-alive", "0"], ["--max-header-bytes", "100"]])
def test_bad_connection_flags_are_one_line_errors(flags):
    assert command_error(*flags).startswith(f"error: {flags[0]}")
