"""Which web pages may use the chat page: its own address, and the origins ``app.allowed_origins`` lists.

A browser sends its login cookie with a request to the page from any page of the same site (another
port of ``localhost`` is the same site), and on loopback without login the page gives every request
the local user. Chainlit 2.12 puts ``project.allow_origins`` (``["*"]`` by default) into Starlette's
CORS layer with credentials, which answers any ``Origin`` with ``access-control-allow-credentials:
true`` and echoes it, and its socket.io server checks no origin at all (``cors_allowed_origins=[]``):
a script on any other port could read every chat. This layer replaces Chainlit's: a request or socket
whose ``Origin`` is neither the page's own address nor listed is refused (HTTP 403, the socket closed
before it opens), with no CORS header; a listed origin gets the CORS answer with credentials. A
request without ``Origin`` (a navigation, a script outside a browser) is the page's own.

The page's own address is the one the request names (``Host``, or ``X-Forwarded-Host`` behind a proxy
that sets it), so the container and compose file keep working behind whatever address they are
published on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

PREFLIGHT_MAX_AGE_S = 600
DEFAULT_PORTS = (80, 443)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _host_port(netloc: str) -> tuple[str, int | None]:
    """``host[:port]`` (IPv6 in brackets) as (lower-case host, port or None)."""
    parts = urlsplit(f"//{netloc.strip()}")
    try:
        port = parts.port
    except ValueError:
        port = -1  # matches nothing
    return (parts.hostname or "").lower(), port


def same_origin(origin: str, scope: dict[str, Any]) -> bool:
    """Whether ``origin`` is the address this request was sent to (its ``Host``, or the proxy's
    ``X-Forwarded-Host``). A ``Host`` without a port (a proxy on 80 or 443) matches an origin on a
    default port only: a page on another port of the same host is another origin."""
    parts = urlsplit(origin)
    try:
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    host = parts.hostname.lower()
    port = port or (443 if parts.scheme == "https" else 80)
    for named in (_header(scope, b"host"), _header(scope, b"x-forwarded-host")):
        if not named:
            continue
        for each in named.split(","):
            want_host, want_port = _host_port(each)
            if want_host == host and (port == want_port or (want_port is None and port in DEFAULT_PORTS)):
                return True
    return False


class OnlyAllowedOrigins:
    """ASGI middleware: the page's own address and ``listed`` origins in, every other origin out (the
    module docstring says why)."""

    def __init__(self, app: Any, listed: Iterable[str]) -> None:
        self.app = app
        self.listed = frozenset(listed)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        origin = _header(scope, b"origin") if scope["type"] in ("http", "websocket") else None
        if origin is None or same_origin(origin, scope):
            await self.app(scope, receive, send)
        elif origin not in self.listed:
            await self._refuse(scope, receive, send, origin)
        elif scope["type"] == "websocket":
            await self.app(scope, receive, send)
        elif scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
            await self._preflight(scope, send, origin)
        else:
            await self.app(scope, receive, _with_cors(send, origin))

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any, origin: str) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect; closing before accepting answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008})
            return
        body = (
            f"Refused: this chat page answers its own address and the origins in app.allowed_origins "
            f"only, and {origin} is not one of them.\n"
        ).encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 403, "headers": [*headers, (b"vary", b"Origin")]})
        await send({"type": "http.response.body", "body": body})

    async def _preflight(self, scope: dict[str, Any], send: Any, origin: str) -> None:
        asked = _header(scope, b"access-control-request-headers")
        headers = [
            *_cors_headers(origin),
            (b"access-control-allow-methods", b"GET, POST, PUT, PATCH, DELETE, OPTIONS"),
            (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
            (b"content-length", b"0"),
        ]
        if asked:
            headers.append((b"access-control-allow-headers", asked.encode("latin-1")))
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-credentials", b"true"),
        (b"vary", b"Origin"),
    ]


def _with_cors(send: Any, origin: str) -> Any:
    """``send`` that adds the CORS answer for ``origin`` to the response's headers."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            kept = [(k, v) for k, v in message.get("headers", []) if not k.lower().startswith(b"access-control-")]
            message = {**message, "headers": [*kept, *_cors_headers(origin)]}
        await send(message)

    return sending
