"""Who may call the server (Access, from the command's flags; two ASGI middlewares):

- HostCheck: the Host names the server answers to. A page on another site can reach a server
  on 127.0.0.1 by DNS rebinding (its own name made to resolve to 127.0.0.1), but its requests
  still carry its own name as Host; so, as local development servers do, a server bound to a
  loopback address answers only Host: localhost, 127.0.0.1 and [::1] (any port) by default.
  --allowed-hosts adds names ("*.example.com": its subdomains) or, "*", lets any through; a
  server bound to another address takes any Host unless --allowed-hosts is given. A refused
  Host is a 400.
- ApiKey: with --api-key (or PYGPT_API_KEY), every /v1 route and /metrics need the header
  Authorization: Bearer KEY (compared in constant time), else a 401 with WWW-Authenticate:
  Bearer. /health, the playground page (which asks for the key when a request answers 401) and
  the API's schema stay open: they hold nothing of the model's."""
from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Optional

from starlette.types import ASGIApp, Receive, Scope, Send

from pygpt_runtime.serve.errors import error_body

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MAX_HOST_SHOWN = 100
PROTECTED = ("/v1/", "/metrics")  # the paths (prefixes) behind the API key


def is_loopback(address: str) -> bool:
    """Whether a --host address is a loopback one (localhost, 127.0.0.0/8, ::1)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """allowed_hosts: the Host names answered (None: any); api_key: the key /v1 and /metrics
    need (None: none)."""
    allowed_hosts: Optional[tuple[str, ...]] = None
    api_key: Optional[str] = None

    @classmethod
    def from_flags(cls, bind: str, allowed_hosts: list[str],
                   api_key: Optional[str]) -> "Access":
        names = tuple(name.strip().lower().rstrip(".") for name in allowed_hosts)
        if any(not name for name in names):
            raise ValueError("--allowed-hosts takes host names, got an empty one")
        if api_key is not None and not api_key.strip():
            raise ValueError("--api-key (or PYGPT_API_KEY) is empty")
        if "*" in names or (not names and not is_loopback(bind)):
            return cls(None, api_key)
        return cls(LOOPBACK_NAMES + tuple(n.strip("[]") for n in names), api_key)


def host_name(value: str) -> str:
    """The name of a Host header's value, lower case, without its port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return name.rstrip(".")


def allowed(name: str, hosts: tuple[str, ...]) -> bool:
    return any(name == host or (host.startswith("*.") and name.endswith(host[1:]))
               for host in hosts)


def header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class HostCheck:
    """ASGI middleware: a 400 for a request whose Host is not one of hosts."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...]):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = header(scope, b"host")
            if given is None or not allowed(host_name(given), self.hosts):
                shown = "none" if given is None else repr(given[:MAX_HOST_SHOWN])
                response = error_body(400, f"the Host header ({shown}) is not a name this server "
                                           "answers to; its --allowed-hosts flag adds names")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class ApiKey:
    """ASGI middleware: a 401 for a request to a protected path without the key."""

    def __init__(self, app: ASGIApp, key: str):
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED):
            given = header(scope, b"authorization")
            scheme, _, token = (given or "").partition(" ")
            if given is None or scheme.lower() != "bearer":
                message, challenge = ("this server needs an API key: send it as the header "
                                      "Authorization: Bearer KEY"), "Bearer"
            elif not hmac.compare_digest(token.strip().encode("latin-1"), self.key):
                message, challenge = ("the API key is not this server's",
                                      'Bearer error="invalid_token"')
            else:
                return await self.app(scope, receive, send)
            response = error_body(401, message)
            response.headers["WWW-Authenticate"] = challenge
            return await response(scope, receive, send)
        await self.app(scope, receive, send)
