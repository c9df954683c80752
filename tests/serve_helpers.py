"""The server tests' helpers: pygpt-serve started in a subprocess on a free loopback port, in an
environment where `import torch` fails, the app in process over the format 1 GPT export of
tests/fixtures (app_client), the server-sent events of a streamed completion, and an
onnxruntime session that counts its graph calls, and headless Chromium for the playground."""
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from helpers import torch_free_env

FIXTURE_EXPORT = Path(__file__).resolve().parent / "fixtures" / "gpt-onnx-format1"


def tiny_gpt(root):
    """A tiny char GPT trained a few steps into root/ckpt (context 16, so 40 tokens slide its
    window twice) and exported into root/onnx; root/ckpt."""
    from pygpt import export as exporter
    from pygpt.config import ModelConfig, TrainConfig
    from pygpt.training import train

    train(ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=16),
          TrainConfig(out=str(root / "ckpt"), max_iters=40, eval_interval=40, eval_iters=1,
                      batch_size=8, warmup_iters=2, lr=1e-2), progress=False)
    exporter.export(root / "ckpt", root / "onnx")
    return root / "ckpt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m pygpt.serve --model folder *flags` running (torch blocked) until stop(); with
    source "--ckpt", `python -m pygpt.serve --ckpt folder *flags` (torch allowed)."""

    def __init__(self, folder, tmp_path, *flags: str, source: str = "--model"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pygpt.serve", source, str(folder), "--port",
             str(self.port), "--log-level", "warning", *flags],
            env=torch_free_env(tmp_path, blocked=("torch",) if source == "--model" else ()),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited: {self.process.communicate()[1]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("the server did not answer /health within 120 s")
            time.sleep(0.2)
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def stop(self, sig=signal.SIGTERM) -> tuple[int, str]:
        """Stops the server with sig: (its exit status, its stderr)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            _, err = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        return self.process.returncode, err


def wait_for(server, **wanted) -> None:
    """Returns once /health says what wanted says (fails after 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        health = server.client.get("/health").json()
        if all(health[k] == v for k, v in wanted.items()):
            return
        assert time.monotonic() < deadline, f"/health stayed {health}, wanted {wanted}"
        time.sleep(0.05)


def app_client(access=None):
    """starlette's TestClient over the app of FIXTURE_EXPORT (access: a serve.access.Access);
    used as a context manager it runs the app's lifespan, which closes the worker."""
    from fastapi.testclient import TestClient

    from pygpt_runtime.serve.access import Access
    from pygpt_runtime.serve.app import create_app
    from pygpt_runtime.serve.served import Limits, open_export

    app = create_app(open_export(str(FIXTURE_EXPORT), Limits()), access or Access())
    return TestClient(app, base_url="http://127.0.0.1:8000")


def command_error(*flags: str, main=None) -> str:
    """The one-line error pygpt-serve --model FIXTURE_EXPORT *flags exits with, run in process
    (the signal handlers it sets are put back); main: the command (default pygpt-serve's; e.g.
    pygpt.serve's, which also takes --ckpt)."""
    from pygpt_runtime.serve import command

    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exited:
            (main or command.main)(["--model", str(FIXTURE_EXPORT), *flags])
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
    return str(exited.value)


class CountingSession:
    """An onnxruntime session that counts its runs."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self.session.run(*args, **kwargs)


def events(response) -> list:
    """The data of each server-sent event of a streamed response ("[DONE]" as is)."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", line
    return out


@contextlib.contextmanager
def chromium(width: int = 1000, height: int = 760):
    """Headless Debian Chromium driven by Selenium (skips where either is missing)."""
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs "
                    "them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options,
                               service=webdriver.ChromeService(executable_path=driver_path))
    try:
        yield browser
    finally:
        browser.quit()
