"""Exposed means login: a chat page that listens beyond this machine asks for a good password.

Login is on when there are users (``app.users``: name -> password) and a secret that signs the
login cookie (Chainlit's ``CHAINLIT_AUTH_SECRET``, or ``app.auth_secret``). Both come from any
settings layer: the environment (``ERNIECHAT_APP__USERS='{"demo": "..."}'``), or a mounted
settings file named by ``ERNIECHAT_CONFIG`` (``[app] users = {...}``, ``auth_secret = "..."``).

On loopback (127.0.0.0/8, ::1, localhost) login stays optional, as before, and a weak password
is only warned about. On any other address (0.0.0.0 in a container, a LAN address) the page
refuses to start without login or with a weak password: ``up`` checks before it starts the
engine, and ``app.py`` checks again at import, so ``chainlit run app.py --host 0.0.0.0`` refuses
too. The message says how to set them. The engine's own host has the same rule, with
``engine.api_key`` (``config.settings.engine_exposed_without_key``).

Guessing is slowed: after a few failed logins for a user name, or from a client address, further
attempts are refused for a window that doubles with each further failure (:class:`LoginThrottle`).
A refusal costs the page nothing, so other people's logins and chats go on meanwhile.
"""

from __future__ import annotations

import hmac
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from config.errors import ErniechatError, SettingsError
from config.settings import Settings, is_loopback

__all__ = ["is_loopback"]  # re-exported: the page's rules and their tests name it here

SECRET_ENV = "CHAINLIT_AUTH_SECRET"
"""Chainlit signs its login cookie with this variable's value (chainlit/auth/jwt.py)."""

MIN_PASSWORD = 12
COMMON_PASSWORDS = frozenset(
    {
        "123456789012",
        "1234567890123",
        "123456789abc",
        "1q2w3e4r5t6y",
        "a-good-password",
        "abc123abc123",
        "administrator",
        "changeme1234",
        "iloveyou1234",
        "letmein12345",
        "password1234",
        "password12345",
        "passwordpassword",
        "qwerty123456",
        "qwertyuiop12",
        "qwertyuiopasdf",
        "welcome12345",
    }
)
"""Common passwords of the minimum length or more (shorter ones are refused for their length)."""
GOOD_PASSWORD = (
    f"a good password has at least {MIN_PASSWORD} characters, is not a common one and is not the user name "
    "(four random words, or: python3 -c 'import secrets; print(secrets.token_urlsafe(12))')"
)


def auth_secret(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """The cookie-signing secret: ``CHAINLIT_AUTH_SECRET`` wins over ``app.auth_secret``."""
    env = os.environ if environ is None else environ
    return env.get(SECRET_ENV) or settings.app.auth_secret or None


def password_weakness(name: str, password: str) -> str | None:
    """Why ``password`` is a weak one for user ``name`` (a guess would find it), or None."""
    folded = password.casefold()
    if folded == name.casefold():
        return "the user name itself"
    if folded in COMMON_PASSWORDS:
        return "a common password"
    if len(password) < MIN_PASSWORD:
        return f"shorter than {MIN_PASSWORD} characters"
    return None


def weak_passwords(settings: Settings) -> list[str]:
    """``name (why)`` for each user whose password is weak (an empty one is named apart)."""
    return [
        f"{name} ({why})"
        for name, password in sorted(settings.app.users.items())
        if password and (why := password_weakness(name, password))
    ]


def weak_password_warning(settings: Settings) -> str | None:
    """The warning for a page on loopback with weak passwords (beyond loopback they are refused)."""
    weak = weak_passwords(settings)
    if not weak:
        return None
    return (
        f"warning: a weak password for {', '.join(weak)}: accepted while the page listens on this machine "
        f"only, refused beyond it; {GOOD_PASSWORD}"
    )


def login_problem(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """What an exposed page lacks for a password login (an empty or weak password counts), or None."""
    missing = []
    if not settings.app.users:
        missing.append("no users (app.users)")
    elif blank := sorted(name for name, password in settings.app.users.items() if not password):
        missing.append(f"an empty password for {', '.join(blank)}")
    if weak := weak_passwords(settings):
        missing.append(f"a weak password for {', '.join(weak)}")
    if not auth_secret(settings, environ):
        missing.append(f"no secret for the login cookie ({SECRET_ENV} or app.auth_secret)")
    return " and ".join(missing) or None


def exposed_without_login(
    settings: Settings, host: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why the page must not start (it listens beyond loopback without a good login), or None."""
    host = settings.app.host if host is None else host
    if is_loopback(host):
        return None
    problem = login_problem(settings, environ)
    if problem is None:
        return None
    return (
        f"the chat page would listen on {host}, beyond this machine, so it needs a password login, "
        f"but it has {problem}. Set both, in the environment:\n"
        """  ERNIECHAT_APP__USERS='{"demo": "<a good password>"}'\n"""
        f"  {SECRET_ENV}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')"
        "   (or ERNIECHAT_APP__AUTH_SECRET)\n"
        "or in a settings file (a mounted file in a container) named by ERNIECHAT_CONFIG:\n"
        """  [app]\n  users = { demo = "<a good password>" }\n  auth_secret = "<a long random string>"\n"""
        f"({GOOD_PASSWORD})\n"
        "or keep the page on this machine: --host 127.0.0.1 (ERNIECHAT_APP__HOST=127.0.0.1)."
    )


def login_on(settings: Settings, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the page asks for a login: users and a cookie secret, both."""
    return bool(settings.app.users) and auth_secret(settings, environ) is not None


def login_note(settings: Settings, environ: Mapping[str, str] | None = None) -> str:
    """What ``up`` says about the page's login: exactly what :func:`enable_login` decides."""
    if login_on(settings, environ):
        return f"note: the page has login (users: {', '.join(sorted(settings.app.users))})"
    if settings.app.users:
        return (
            "note: the page has NO login: app.users is set but there is no secret for the login cookie "
            f"({SECRET_ENV} or app.auth_secret); anyone who reaches the page can chat"
        )
    return "note: the page has no login (no app.users); anyone who reaches the page can chat"


def enable_login(settings: Settings, host: str) -> bool:
    """For ``app.py`` at import: True when login is on (after handing ``app.auth_secret`` to
    Chainlit), False when off. Raises SettingsError with the reason when the page is exposed
    without a good login (``app.py`` then exits with it)."""
    why = exposed_without_login(settings, host)
    if why:
        raise SettingsError(why)
    if not login_on(settings):
        return False  # on loopback without users or secret: an open page, as before
    secret = auth_secret(settings)
    assert secret is not None  # login_on checked it
    os.environ.setdefault(SECRET_ENV, secret)  # Chainlit reads the secret from its environment
    return True


class TooManyLogins(ErniechatError):
    """A login attempt refused unchecked: its user name or client address failed too often lately."""

    def __init__(self, wait_s: float) -> None:
        self.retry_after = max(1, math.ceil(wait_s))
        super().__init__(f"Too many failed logins; try again in {self.retry_after} s.")


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    locked_until: float = 0.0


class LoginThrottle:
    """Failed logins per user name and per client address. The first ``free`` failures of a key cost
    nothing; each further one locks the key for ``first_lock_s``, doubled per failure, at most
    ``max_lock_s``. A locked key's attempts are refused unchecked (and not counted). A key's failures
    are forgotten ``forget_s`` after its last one, and a user's at its next good login.

    Per page process: several processes behind one port keep each client address on one process,
    so the address limit holds; a user name guessed from many addresses gets each process's limit."""

    def __init__(
        self,
        free: int = 5,
        first_lock_s: float = 1.0,
        max_lock_s: float = 300.0,
        forget_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        most_keys: int = 10_000,
    ) -> None:
        self.free, self.first_lock_s, self.max_lock_s, self.forget_s = free, first_lock_s, max_lock_s, forget_s
        self.clock, self.most_keys = clock, most_keys
        self.failures: dict[tuple[str, str], _Failures] = {}

    @staticmethod
    def keys(username: str, address: str) -> list[tuple[str, str]]:
        return [("user", username), ("address", address)]

    def check(self, keys: list[tuple[str, str]]) -> None:
        """Raise TooManyLogins while any of ``keys`` is locked."""
        now = self.clock()
        wait = max((f.locked_until - now for k in keys if (f := self.failures.get(k))), default=0.0)
        if wait > 0:
            raise TooManyLogins(wait)

    def failed(self, keys: list[tuple[str, str]]) -> None:
        now = self.clock()
        if len(self.failures) >= self.most_keys:
            self._forget_old(now)
        for key in keys:
            f = self.failures.get(key)
            if f is None or now - f.last > self.forget_s:
                f = self.failures[key] = _Failures()
            f.count, f.last = f.count + 1, now
            if f.count >= self.free:
                f.locked_until = now + min(self.max_lock_s, self.first_lock_s * 2 ** min(f.count - self.free, 32))

    def succeeded(self, username: str) -> None:
        """A good login clears its user's failures (not its address's: one account must not let
        an address go on guessing others)."""
        self.failures.pop(("user", username), None)

    def _forget_old(self, now: float) -> None:
        """Bound the memory a flood of made-up names takes: drop the unlocked, else the oldest."""
        for key in [k for k, f in self.failures.items() if f.locked_until <= now]:
            del self.failures[key]
        if len(self.failures) >= self.most_keys:
            for key in sorted(self.failures, key=lambda k: self.failures[k].last)[: len(self.failures) // 2]:
                del self.failures[key]


def check_login(settings: Settings, throttle: LoginThrottle, username: str, password: str, address: str) -> bool:
    """Whether ``username``/``password`` is a user's login. Raises TooManyLogins, unchecked, while
    the user name or the client address is locked after failed logins."""
    keys = throttle.keys(username, address)
    throttle.check(keys)
    expected = settings.app.users.get(username)
    # compared even for an unknown name: the time taken does not tell which names exist
    good = hmac.compare_digest((expected or "\0").encode(), password.encode()) and expected is not None
    if good:
        throttle.succeeded(username)
    else:
        throttle.failed(keys)
    return good
