"""Serve a pygpt ONNX export over HTTP, without torch (also `python -m pygpt.serve`):

    pygpt-serve --model out/onnx/ [--host 127.0.0.1 --port 8000]

then open http://127.0.0.1:8000/ (the playground: it works offline) or call the API, whose
schema is at /openapi.json (FastAPI's /docs page draws it, with scripts it loads from the
internet):

    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "onnx", "prompt": "ROMEO:", "max_tokens": 100, "stream": true}'

A GPT answers POST /v1/completions (OpenAI's API: its `openai` client works unchanged) and GET
/v1/models; a BERT POST /v1/fill-mask or /v1/classify; a translator POST /v1/translate; every
export GET /health. The model is named after its folder (out/onnx/ serves "onnx", as the
server says when it starts): a completion request's "model", which the `openai` client must
pass, is that name. Requests that arrive together decode together; a full queue answers 503.
Ctrl-C or SIGTERM stops the server cleanly: no new connections, open streams finish (up to
--grace seconds, then they are closed), exit status 130 / 143.

A client gets --header-timeout seconds to send a request's headers and --body-timeout for its
body (408 after); --limit-concurrency connections are served (503 past it). Bound to a loopback
address, the server answers only Host: localhost, 127.0.0.1 or [::1] (--allowed-hosts adds
names). With --api-key (or PYGPT_API_KEY) the /v1 routes and /metrics need the header
Authorization: Bearer KEY; /health and the playground page stay open.

GET /metrics answers in Prometheus' text format; every response has an X-Request-Id and every
request a log line (--log-level info). Needs the `serve` extra (FastAPI, uvicorn,
prometheus_client): pip install 'pygpt-runtime[serve]'."""
from __future__ import annotations

import argparse
import asyncio
import copy
import os
import signal
import sys
from typing import Any, Callable, NamedTuple, Optional

from pygpt_runtime.cli_checks import HelpFormatter, check_threads


class Stopped(Exception):
    """SIGINT or SIGTERM arrived (uvicorn has shut down; it raises the signal again after)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.status = 128 + signum


def _stop(signum: int, _frame) -> None:
    raise Stopped(signum)


class Checkpoints(NamedTuple):
    """What serves a checkpoint (pygpt.serve, with torch)."""

    help: str  # the --ckpt flag's
    dtypes: tuple[str, ...]  # the number types it computes in (--dtype), the default first
    # (folder, limits, --threads, --dtype) -> the served.Served of the checkpoint
    open: Callable[[str, Any, Optional[int], str], Any]


def _server(served: Any, config: Any) -> Any:
    """uvicorn's server, which once stopping ends the open requests itself a moment before
    its grace period is over (the workers close: an open stream ends with an error event, a
    waiting request with an error), rather than leave uvicorn to cancel them (tracebacks, and
    streams cut without a word)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Optional[list] = None) -> None:
            loop, grace = asyncio.get_running_loop(), config.timeout_graceful_shutdown
            ending = loop.call_later(grace - min(1.0, grace / 2),
                                     lambda: loop.run_in_executor(None, served.close))
            try:
                await super().shutdown(sockets)
            finally:
                ending.cancel()

    return Server(config)


def serving(served: Any, host: str, port: int) -> str:
    """The start-up line: what is served, where, and the name its requests give it."""
    address = f"[{host}]" if ":" in host else host
    line = f"serving {served.summary()} at http://{address}:{port}/"
    if served.family.names_model:
        line += f'; clients pass "model": "{served.name}"'
    return line


def parser(checkpoints: Optional[Checkpoints] = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pygpt-serve" if checkpoints is None else "pygpt.serve",
                                description=__doc__, formatter_class=HelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="the export folder (runner.json, *.onnx); its name is "
                                        "the model's name in requests")
    if checkpoints is not None:
        source.add_argument("--ckpt", help=checkpoints.help)
        p.add_argument("--dtype", choices=checkpoints.dtypes, default=None,
                       help="--ckpt: number type of the matrix products, bfloat16 or float16 "
                            f"under autocast (default {checkpoints.dtypes[0]})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--int8", action="store_true", help="serve the int8-quantized model")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime intra-op threads (default: onnxruntime's choice)")
    p.add_argument("--queue-size", type=int, default=64,
                   help="rows (gpt) or requests waiting at most; more are refused with 503")
    p.add_argument("--max-batch", type=int, default=32,
                   help="rows decoded together; prompts or sentences one request may hold")
    p.add_argument("--max-tokens", type=int, default=2048,
                   help="the largest max_tokens a completion may ask")
    p.add_argument("--max-text-tokens", type=int, default=4096,
                   help="the most tokens of a prompt or text")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="the largest request body (413 beyond)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds open streams may take to finish once stopping")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="the server's log level (info: a line per request)")
    p.add_argument("--limit-concurrency", type=int, default=256,
                   help="connections served at once; a request on one past it is a 503 "
                        "(not /health or /metrics), and one opened past twice as many is "
                        "closed unread")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a request's headers may take to arrive (408 after)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request's body may take to arrive after its headers")
    p.add_argument("--timeout-keep-alive", type=float, default=5.0,
                   help="seconds an idle connection is kept open between requests")
    p.add_argument("--max-header-bytes", type=int, default=16384,
                   help="the largest request line and headers (431 beyond)")
    p.add_argument("--allowed-hosts", nargs="+", default=[], metavar="NAME",
                   help="Host names answered besides localhost, 127.0.0.1 and [::1] "
                        "(\"*.example.com\": its subdomains; \"*\": any); by default a server "
                        "bound to a loopback address answers only those, another any")
    p.add_argument("--api-key", default=os.environ.get("PYGPT_API_KEY"),
                   help="the key /v1 and /metrics need as Authorization: Bearer KEY (default: "
                        "the environment variable PYGPT_API_KEY, which `ps` does not show; "
                        "none: no key)")
    return p


def log_config(level: str) -> dict:
    """uvicorn's logging configuration, with the "pygpt.serve" logger (a line per request)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["pygpt.serve"] = {"handlers": ["default"], "level": level.upper(),
                                        "propagate": False}
    return config


def main(argv: Optional[list[str]] = None, checkpoints: Optional[Checkpoints] = None) -> None:
    """The command; with checkpoints (pygpt.serve), --ckpt serves a checkpoint through it."""
    args = parser(checkpoints).parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)
    try:
        try:
            check_threads(args.threads)
            if not 0 <= args.port <= 65535:
                raise ValueError(f"--port must be in 0..65535, got {args.port}")
            if not args.grace >= 0:
                raise ValueError(f"--grace must be >= 0 seconds, got {args.grace}")
            if args.limit_concurrency < 1:
                raise ValueError(f"--limit-concurrency must be at least 1, got "
                                 f"{args.limit_concurrency}")
            if not args.timeout_keep_alive > 0:
                raise ValueError(f"--timeout-keep-alive must be > 0 seconds, got "
                                 f"{args.timeout_keep_alive}")
            try:
                import uvicorn

                from pygpt_runtime.serve.access import Access
                from pygpt_runtime.serve.app import create_app
                from pygpt_runtime.serve.connections import Guards, guarded_protocol
                from pygpt_runtime.serve.served import Limits, open_export
            except ImportError as e:
                raise ImportError(f"the server needs FastAPI, uvicorn and prometheus_client "
                                  f"({e}): pip install 'pygpt-runtime[serve]'") from None
            guards = Guards(args.header_timeout, args.body_timeout, args.max_header_bytes)
            access = Access.from_flags(args.host, args.allowed_hosts, args.api_key)
            limits = Limits(args.queue_size, args.max_batch, args.max_tokens,
                            args.max_text_tokens, args.max_body_bytes)
            if getattr(args, "ckpt", None) is not None:
                if args.int8:
                    raise ValueError("--int8 is for an export (--model); a checkpoint is served "
                                     "as it was saved")
                served = checkpoints.open(args.ckpt, limits, args.threads,
                                          args.dtype or checkpoints.dtypes[0])
            else:
                if getattr(args, "dtype", None) is not None:
                    raise ValueError("--dtype is for a checkpoint (--ckpt); an export computes "
                                     "as it was exported (float32, or --int8)")
                served = open_export(args.model, limits, "int8" if args.int8 else "fp32",
                                     args.threads)
        except (ValueError, OSError, ImportError) as e:
            raise SystemExit(f"error: {e}") from None
        print(f"pygpt-serve: {serving(served, args.host, args.port)}", file=sys.stderr,
              flush=True)
        server = _server(served, uvicorn.Config(
            create_app(served, access), host=args.host, port=args.port,
            log_level=args.log_level, log_config=log_config(args.log_level),
            access_log=False, timeout_graceful_shutdown=args.grace,
            http=guarded_protocol(guards), limit_concurrency=args.limit_concurrency,
            timeout_keep_alive=args.timeout_keep_alive,
            h11_max_incomplete_event_size=args.max_header_bytes))
        try:
            server.run()  # a port it cannot listen on: uvicorn's error line, exit status 1
        finally:
            served.close()
    except Stopped as e:
        print("pygpt-serve: stopped", file=sys.stderr)
        raise SystemExit(e.status) from None


if __name__ == "__main__":
    main()
