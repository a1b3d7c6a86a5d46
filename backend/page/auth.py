"""Exposed means login: a chat page that listens beyond this machine asks for a password.

Login is on when there are users (``app.users``: name -> password) and a secret that signs the
login cookie (Chainlit's ``CHAINLIT_AUTH_SECRET``, or ``app.auth_secret``). Both come from any
settings layer: the environment (``ERNIECHAT_APP__USERS='{"demo": "..."}'``), or a mounted
settings file named by ``ERNIECHAT_CONFIG`` (``[app] users = {...}``, ``auth_secret = "..."``).

On loopback (127.0.0.0/8, ::1, localhost) login stays optional, as before. On any other
address (0.0.0.0 in a container, a LAN address) the page refuses to start without it: ``up``
checks before it starts the engine, and ``app.py`` checks again at import, so ``chainlit run
app.py --host 0.0.0.0`` refuses too. The message says how to set them.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

from config.errors import SettingsError
from config.settings import Settings

SECRET_ENV = "CHAINLIT_AUTH_SECRET"
"""Chainlit signs its login cookie with this variable's value (chainlit/auth/jwt.py)."""


def is_loopback(host: str) -> bool:
    """True when a server bound to ``host`` is reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may resolve to anything


def auth_secret(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """The cookie-signing secret: ``CHAINLIT_AUTH_SECRET`` wins over ``app.auth_secret``."""
    env = os.environ if environ is None else environ
    return env.get(SECRET_ENV) or settings.app.auth_secret or None


def login_problem(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """What an exposed page lacks for a password login (an empty password counts), or None."""
    missing = []
    if not settings.app.users:
        missing.append("no users (app.users)")
    elif blank := sorted(name for name, password in settings.app.users.items() if not password):
        missing.append(f"an empty password for {', '.join(blank)}")
    if not auth_secret(settings, environ):
        missing.append(f"no secret for the login cookie ({SECRET_ENV} or app.auth_secret)")
    return " and ".join(missing) or None


def exposed_without_login(
    settings: Settings, host: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why the page must not start (it listens beyond loopback without login), or None."""
    host = settings.app.host if host is None else host
    if is_loopback(host):
        return None
    problem = login_problem(settings, environ)
    if problem is None:
        return None
    return (
        f"the chat page would listen on {host}, beyond this machine, so it needs a password login, "
        f"but it has {problem}. Set both, in the environment:\n"
        """  ERNIECHAT_APP__USERS='{"demo": "a-good-password"}'\n"""
        f"  {SECRET_ENV}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')"
        "   (or ERNIECHAT_APP__AUTH_SECRET)\n"
        "or in a settings file (a mounted file in a container) named by ERNIECHAT_CONFIG:\n"
        """  [app]\n  users = { demo = "a-good-password" }\n  auth_secret = "<a long random string>"\n"""
        "or keep the page on this machine: --host 127.0.0.1 (ERNIECHAT_APP__HOST=127.0.0.1)."
    )


def enable_login(settings: Settings, host: str) -> bool:
    """For ``app.py`` at import: True when login is on (after handing ``app.auth_secret`` to
    Chainlit), False when off. Raises SettingsError with the reason when the page is exposed
    without login (``app.py`` then exits with it)."""
    why = exposed_without_login(settings, host)
    if why:
        raise SettingsError(why)
    secret = auth_secret(settings)
    if not settings.app.users or secret is None:
        return False  # on loopback without users or secret: an open page, as before
    os.environ.setdefault(SECRET_ENV, secret)  # Chainlit reads the secret from its environment
    return True
