"""Who may call the server: the Host allow-list (a server bound to a loopback address answers
only local host names: DNS rebinding) and the API key (--api-key or PYGPT_API_KEY: Bearer auth on
/v1 and /metrics, /health and the playground page open), in process (serve_helpers.app_client);
the command's one-line errors for bad flags; and the playground, in headless Chromium, asking
for the key of a server started with one."""

import pytest

pytest.importorskip("fastapi")
from pygpt_runtime.serve import command  # noqa: E402
from pygpt_runtime.serve.access import Access, host_name, is_loopback  # noqa: E402
from serve_helpers import FIXTURE_EXPORT, Server, app_client, chromium, command_error  # noqa: E402

KEY = "s3cret-key"


def test_access_from_flags_guards_loopback_servers_only():
    local = ("localhost", "127.0.0.1", "::1")
    assert Access.from_flags("127.0.0.1", [], None).allowed_hosts == local
    assert Access.from_flags("::1", ["Box.LAN."], None).allowed_hosts == (*local, "box.lan")
    assert Access.from_flags("0.0.0.0", [], None).allowed_hosts is None
    assert Access.from_flags("0.0.0.0", ["a.example"], None).allowed_hosts == (*local,
                                                                                "a.example")
    assert Access.from_flags("localhost", ["*"], "k") == Access(None, "k")
    assert [is_loopback(h) for h in ("127.0.0.2", "::1", "localhost", "0.0.0.0", "box")] == [
        True, True, True, False, False]
    assert [host_name(v) for v in ("LocalHost:8000", "[::1]:80", "127.0.0.1", "::1")] == [
        "localhost", "::1", "127.0.0.1", "::1"]


@pytest.mark.parametrize("flags", [["--allowed-hosts", ""], ["--api-key", " "]])
def test_bad_server_flags_are_one_line_errors(flags):
    assert command_error(*flags).startswith(f"error: {flags[0]}")


def test_a_loopback_server_answers_only_local_host_names():
    with app_client(Access.from_flags("127.0.0.1", ["box.lan", "*.example.com"], None)) as c:
        for host in ("localhost:8000", "127.0.0.1", "[::1]:9", "box.lan", "a.b.example.com"):
            assert c.get("/health", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", "example.com", "localhost.evil.example", "127.0.0.1.nip.io"):
            r = c.get("/v1/models", headers={"Host": host})
            assert r.status_code == 400, host
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert "not a name this server answers to" in r.json()["error"]["message"]
            assert "--allowed-hosts" in r.json()["error"]["message"]
            assert len(r.headers["x-request-id"]) == 32


def test_the_api_key_guards_v1_and_metrics_not_health_or_the_page():
    with app_client(Access(None, KEY)) as c:
        for path in ("/v1/models", "/metrics"):
            r = c.get(path)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "Authorization: Bearer KEY" in r.json()["error"]["message"]
            assert len(r.headers["x-request-id"]) == 32
            r = c.get(path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and "invalid_token" in r.headers["www-authenticate"]
            assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 401
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2},
                   headers={"Authorization": f"bearer {KEY}"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        for path in ("/health", "/", "/playground/playground.js", "/openapi.json"):
            assert c.get(path).status_code == 200, path
        counted = c.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    # refused before routing: counted under no route
    assert 'pygpt_requests_total{route="(none)",status="401"} 5.0' in counted


def test_the_openai_client_passes_its_api_key():
    openai = pytest.importorskip("openai")
    with app_client(Access(None, KEY)) as c:
        def client(key):
            return openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=key,
                                 http_client=c, max_retries=0)
        made = client(KEY).completions.create(model=FIXTURE_EXPORT.name, prompt="a",
                                              max_tokens=3)
        assert made.usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError, match="not this server's"):
            client("wrong").completions.create(model=FIXTURE_EXPORT.name, prompt="a",
                                               max_tokens=3)


def test_the_api_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYGPT_API_KEY", KEY)
    assert command.parser().parse_args(["--model", "m"]).api_key == KEY
    assert command.parser().parse_args(["--model", "m", "--api-key", "x"]).api_key == "x"
    monkeypatch.delenv("PYGPT_API_KEY")
    assert command.parser().parse_args(["--model", "m"]).api_key is None


def test_playground_asks_for_the_api_key_in_headless_chromium(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as browser:
        s = Server(FIXTURE_EXPORT, tmp_path, "--api-key", "k3y")
        try:
            browser.get(s.url + "/")
            wait = WebDriverWait(browser, 30)
            wait.until(lambda b: b.find_element(By.ID, "gpt").is_displayed())
            assert not browser.find_element(By.ID, "auth").is_displayed()
            for field, value in (("prompt", "a"), ("max_tokens", "12")):  # chars it knows
                box = browser.find_element(By.ID, field)
                box.clear()
                box.send_keys(value)
            browser.find_element(By.ID, "generate").click()
            wait.until(lambda b: b.find_element(By.ID, "auth").is_displayed())
            assert "API key" in browser.find_element(By.ID, "error").text
            browser.find_element(By.ID, "api-key").send_keys("k3y")
            browser.find_element(By.ID, "use-key").click()
            wait.until(lambda b: not b.find_element(By.ID, "auth").is_displayed())
            browser.find_element(By.ID, "generate").click()
            generated = browser.find_element(By.ID, "generated")
            wait.until(lambda b: len(generated.get_attribute("textContent")) > 0
                       and b.find_element(By.ID, "generate").is_enabled())
            assert browser.find_element(By.ID, "error").text == ""
            assert browser.execute_script("return sessionStorage.getItem('pygpt-api-key')") \
                == "k3y"
        finally:
            s.stop()
