"""Who asks: one local user on loopback without login (so the history sidebar shows with no
password prompt), and the logged-in user of each request, which the data layer checks feedback
against (Chainlit's ``/feedback`` route does not check who asks).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

import chainlit as cl
from chainlit.auth import create_jwt, decode_jwt

from config.settings import Settings, is_loopback

LOCAL_USER = "local"
"""The one user of a page on loopback without login."""
SECRET_ENV = "CHAINLIT_AUTH_SECRET"
REQUEST_USER: ContextVar[str | None] = ContextVar("erniechat_request_user", default=None)
"""The identifier of the logged-in user of the request or socket being served (None: nobody)."""


def local_user_applies(settings: Settings, host: str, login_on: bool) -> bool:
    """One local user (no password prompt) only on loopback, without login and without configured
    users: an exposed page always has its password login, and a page with users is theirs."""
    return is_loopback(host) and not login_on and not settings.app.users


class _Identity:
    """ASGI middleware: notes who asks (for the feedback check) and, with the local user, gives each
    request and socket the local user's login cookie, so no login form is ever shown. Only a request
    that names a loopback address (``Host``) is the local user's: a web page whose own name was made to
    resolve to 127.0.0.1 (DNS rebinding) names itself, and gets nobody."""

    def __init__(self, app: Any, token: Callable[[], str] | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.token is not None and _names_loopback(scope):
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"cookie"]
            kept = [
                c
                for h in scope.get("headers", [])
                if h[0] == b"cookie"
                for c in h[1].decode("latin-1").split(";")
                if c.strip() and not c.strip().startswith("access_token")
            ]
            cookie = "; ".join([f"access_token={self.token()}", *(c.strip() for c in kept)])
            scope = {**scope, "headers": [*headers, (b"cookie", cookie.encode("latin-1"))]}
        marker = REQUEST_USER.set(_asker(scope))
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_USER.reset(marker)


def _names_loopback(scope: dict[str, Any]) -> bool:
    """Whether the request's ``Host`` is a loopback address or ``localhost`` (with any port)."""
    for key, value in scope.get("headers", []):
        if key == b"host":
            host = urlsplit(f"//{value.decode('latin-1').strip()}").hostname or ""
            return is_loopback(host)
    return False


def _asker(scope: dict[str, Any]) -> str | None:
    """The logged-in user a request's cookie or bearer token names (None: nobody)."""
    token = None
    for key, value in scope.get("headers", []):
        if key == b"authorization" and value.lower().startswith(b"bearer "):
            token = value[7:].decode("latin-1")
        elif key == b"cookie" and token is None:
            for part in value.decode("latin-1").split(";"):
                name, _, val = part.strip().partition("=")
                if name == "access_token":
                    token = val
    if not token:
        return None
    try:
        return decode_jwt(token).identifier
    except Exception:
        return None


def use_identity(local_user: bool) -> None:
    """Install the middleware (before the server starts); with ``local_user``, the one local user."""
    from chainlit.server import app

    token: Callable[[], str] | None = None
    if local_user:
        os.environ.setdefault(SECRET_ENV, secrets.token_urlsafe(48))  # signs only this process's cookies
        user = cl.User(identifier=LOCAL_USER, metadata={"provider": "local"})
        made: list[tuple[float, str]] = []

        def fresh() -> str:
            if not made or time.monotonic() - made[0][0] > 3600:  # Chainlit's tokens expire (15 days by default)
                made[:] = [(time.monotonic(), create_jwt(user))]
            return made[0][1]

        token = fresh

        async def local(headers: Any) -> cl.User:
            return user

        cl.header_auth_callback(local)
    app.add_middleware(_Identity, token=token)
