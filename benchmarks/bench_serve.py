"""Load benchmark of pygpt-serve on loopback: for 1, 4, 16 and 64 concurrent clients, each streaming
completions one after another for --seconds, the aggregate tokens/s, the p50/p99 time to the
first token and per request, the server's peak RSS and the errors (which must be 0).

    python -m pygpt.export --ckpt out/ --out out/onnx      # the `baby` model
    python benchmarks/bench_serve.py --model out/onnx --seconds 60

The server runs in its own process (python -m pygpt_runtime.serve.command) on a free port, with
--max-batch at least the most clients; the clients are threads with httpx. Client i sends the
first len(prompt) - i % len(prompt) characters of --prompt, so that rows of different lengths
decode together (as real traffic has them). On a machine of more than two cores the clients
(this process) are pinned to the last core and the server to the others, so that the load
generator does not take the server's cores; on two cores both share them (it says which).
Report the CPU with the numbers (benchmarks/machine.py prints it); --seconds 2 makes a smoke
run."""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (Linux: VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib / 1024


def client(url: str, body: dict, until: float, out: dict, lock: threading.Lock) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        while time.monotonic() < until:
            start, first, tokens = time.monotonic(), None, 0
            try:
                with http.stream("POST", "/v1/completions", json=body) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[6:])
                        if "error" in event:
                            raise RuntimeError(event["error"]["message"])
                        if event.get("usage"):
                            tokens = event["usage"]["completion_tokens"]
                        elif first is None and event["choices"][0]["text"]:
                            first = time.monotonic() - start
            except (httpx.HTTPError, RuntimeError):
                with lock:
                    out["errors"] += 1
                continue
            with lock:
                out["tokens"] += tokens
                out["ttft"].append(first if first is not None else time.monotonic() - start)
                out["request"].append(time.monotonic() - start)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GPT export folder")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--seconds", type=float, default=60.0, help="per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens a request")
    p.add_argument("--prompt", default="ROMEO:\nWhat say you, my lord?",
                   help="the longest prompt; clients send prefixes of it")
    p.add_argument("--threads", type=int, default=None, help="the server's onnxruntime threads")
    args = p.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "pygpt_runtime.serve.command", "--model", args.model,
           "--port", str(port), "--log-level", "warning",
           "--max-batch", str(max(args.clients)), "--queue-size", str(max(args.clients)),
           "--limit-concurrency", str(4 * max(args.clients) + 16)]
    server = subprocess.Popen(cmd + (["--threads", str(args.threads)] if args.threads else []))
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 2:
        os.sched_setaffinity(server.pid, cores[:-1])
        os.sched_setaffinity(0, cores[-1:])
        print(f"server on cores {cores[:-1]}, clients on core {cores[-1]}")
    else:
        print(f"server and clients share cores {cores} (too few to pin apart)")
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        body = {"max_tokens": args.max_tokens, "temperature": 1.0, "stream": True,
                "stream_options": {"include_usage": True}}
        prompts = [args.prompt[:len(args.prompt) - i % len(args.prompt)]
                   for i in range(max(args.clients))]
        print(f"{'clients':>7} {'tokens/s':>9} {'requests':>8} {'ttft p50':>9} {'ttft p99':>9} "
              f"{'req p50':>8} {'req p99':>8} {'peak RSS':>9} {'errors':>6}")
        for n in args.clients:
            out = {"tokens": 0, "errors": 0, "ttft": [], "request": []}
            lock, start = threading.Lock(), time.monotonic()
            threads = [threading.Thread(target=client, args=(
                url, {**body, "prompt": prompts[i]}, start + args.seconds, out, lock))
                for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - start
            if not out["request"]:
                print(f"{n:>7} no request finished; errors {out['errors']}")
                continue
            print(f"{n:>7} {out['tokens'] / elapsed:>9.0f} {len(out['request']):>8} "
                  f"{pct(out['ttft'], 50) * 1e3:>7.1f}ms {pct(out['ttft'], 99) * 1e3:>7.1f}ms "
                  f"{pct(out['request'], 50):>7.2f}s {pct(out['request'], 99):>7.2f}s "
                  f"{peak_rss_mib(server.pid):>6.0f}MiB {out['errors']:>6}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
