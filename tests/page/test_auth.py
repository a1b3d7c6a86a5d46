"""Exposed means login (backend/page/auth.py): a page beyond loopback refuses to start without a
login with good passwords, and guessed passwords are slowed.

The rules as functions, then the two places that enforce them as a person meets them: ``up``
(before any engine starts) and app.py at import, started either way (``chainlit run app.py --host ...``
or the project's ``backend.page.launch``), then a real page's login under guessing. No test
here listens beyond loopback: the refusals happen before anything binds, and the guesses come from
other loopback addresses (127.0.0.0/8).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from support.services import ROOT, BackendProcess, backend_env

from backend.page.auth import (
    SECRET_ENV,
    LoginThrottle,
    TooManyLogins,
    check_login,
    enable_login,
    exposed_without_login,
    is_loopback,
    login_note,
    password_weakness,
    weak_password_warning,
)
from config.errors import SettingsError
from config.settings import Settings

if TYPE_CHECKING:
    from backend.runtime.up import ChatPage


SECRET = "x" * 48
GOOD = "tulip-orbit-canvas-41"
"""A password the page takes beyond loopback."""


def settings(**app: object) -> Settings:
    return Settings.model_validate({"app": app})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.20", False),
        ("chat.example.org", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_loopback_needs_no_login() -> None:
    assert exposed_without_login(settings(host="127.0.0.1"), environ={}) is None


def test_exposed_page_needs_users_and_a_secret() -> None:
    why = exposed_without_login(settings(host="0.0.0.0"), environ={})
    assert why is not None
    assert "listen on 0.0.0.0" in why and "no users (app.users)" in why and "no secret" in why
    # it says how: both variables, the settings file, or loopback
    for hint in ("ERNIECHAT_APP__USERS=", f"{SECRET_ENV}=", "ERNIECHAT_APP__AUTH_SECRET", "ERNIECHAT_CONFIG"):
        assert hint in why
    assert "ERNIECHAT_APP__HOST=127.0.0.1" in why

    users_only = exposed_without_login(settings(host="0.0.0.0", users={"ann": GOOD}), environ={})
    assert users_only and "no secret" in users_only and "no users" not in users_only
    blank = exposed_without_login(settings(host="0.0.0.0", users={"ann": ""}, auth_secret=SECRET), environ={})
    assert blank and "an empty password for ann" in blank


def test_secret_from_the_environment_or_the_settings() -> None:
    exposed = settings(host="0.0.0.0", users={"ann": GOOD})
    assert exposed_without_login(exposed, environ={SECRET_ENV: SECRET}) is None
    exposed.app.auth_secret = SECRET
    assert exposed_without_login(exposed, environ={}) is None


def test_enable_login_refuses_when_exposed_and_hands_the_secret_to_chainlit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "")  # recorded, so the value set below is undone after the test
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(SettingsError, match="needs a password login"):
        enable_login(settings(), "0.0.0.0")
    assert enable_login(settings(users={"ann": "pw"}), "127.0.0.1") is False  # no secret: open, as before
    with pytest.raises(SettingsError, match=r"a weak password for ann \(shorter than 12 characters\)"):
        enable_login(settings(users={"ann": "pw"}, auth_secret=SECRET), "0.0.0.0")
    assert enable_login(settings(users={"ann": GOOD}, auth_secret=SECRET), "0.0.0.0") is True
    assert os.environ[SECRET_ENV] == SECRET


WEAK_LOGIN = {"ERNIECHAT_APP__USERS": '{"ann": "Ann"}', "ERNIECHAT_APP__AUTH_SECRET": SECRET}
"""A login whose password is the user name."""


@pytest.mark.parametrize(
    ("how", "login"), [("flag", {}), ("env", {}), ("flag", WEAK_LOGIN)], ids=["flag", "env", "weak"]
)
def test_up_refuses_an_exposed_page_without_login_before_the_engine_starts(
    tmp_path: Path, how: str, login: dict[str, str]
) -> None:
    args, env = (["--host", "0.0.0.0"], {}) if how == "flag" else ([], {"ERNIECHAT_APP__HOST": "0.0.0.0"})
    up = BackendProcess(["up", "--model", "demo", *args], backend_env(tmp_path, **env, **login)).start()
    assert up.wait(120) == 2
    out = up.output()
    assert "error: the chat page would listen on 0.0.0.0" in out and "ERNIECHAT_APP__USERS=" in out, out
    if login:
        assert "it has a weak password for ann (the user name itself)" in out, out
        assert "a good password has at least 12 characters, is not a common one and is not the user name" in out
    assert not (tmp_path / "status.json").exists(), "no engine may start"
    assert "plan:" not in out, "refused before planning, let alone starting an engine"


@pytest.mark.parametrize(
    ("start", "login"),
    [
        (["chainlit", "run", "app.py", "--headless"], {}),
        (["backend.page.launch", "app.py"], {}),
        (["backend.page.launch", "app.py"], {"ERNIECHAT_APP__USERS": '{"ann": "s3cret"}', SECRET_ENV: SECRET}),
    ],
    ids=["chainlit-run", "launch", "weak"],
)
def test_the_page_refuses_to_be_exposed_without_login(tmp_path: Path, start: list[str], login: dict[str, str]) -> None:
    env = backend_env(tmp_path, **login)
    if not login:
        env.pop(SECRET_ENV, None)
    argv = [sys.executable, "-m", *start, "--host", "0.0.0.0", "--port", "1"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "the chat page would listen on 0.0.0.0" in done.stderr, done.stderr[-2000:]
    if login:
        assert "a weak password for ann (shorter than 12 characters)" in done.stderr, done.stderr[-2000:]


def test_secret_from_the_settings_turns_login_on(page_without_engine: Callable[..., ChatPage]) -> None:
    page = page_without_engine(ERNIECHAT_APP__USERS='{"ann": "s3cret"}', ERNIECHAT_APP__AUTH_SECRET=SECRET)
    assert httpx.get(page.url + "/auth/config", timeout=10).json()["requireLogin"] is True
    good = httpx.post(page.url + "/login", data={"username": "ann", "password": "s3cret"}, timeout=10)
    assert good.status_code == 200 and "access_token" in good.headers.get("set-cookie", "")
    # on loopback a weak password is taken, with a warning that says what a good one is
    log = page.log_path.read_text()
    assert "warning: a weak password for ann (shorter than 12 characters)" in log, log[-2000:]
    assert "a good password has at least 12 characters" in log


@pytest.mark.parametrize(
    ("name", "password", "why"),
    [
        ("ann", "s3cret", "shorter than 12 characters"),
        ("ann", "Password1234", "a common password"),
        ("annabelle-smith", "ANNABELLE-SMITH", "the user name itself"),
        ("ann", GOOD, None),
    ],
)
def test_what_counts_as_a_weak_password(name: str, password: str, why: str | None) -> None:
    assert password_weakness(name, password) == why


def test_a_weak_password_is_warned_on_loopback_and_refused_beyond() -> None:
    weak = settings(users={"ann": "s3cret", "bob": GOOD}, auth_secret=SECRET)
    warning = weak_password_warning(weak)
    assert warning and "a weak password for ann (shorter than 12 characters)" in warning and "bob" not in warning
    assert exposed_without_login(weak, "127.0.0.1", environ={}) is None
    why = exposed_without_login(weak, "0.0.0.0", environ={})
    assert why and "but it has a weak password for ann (shorter than 12 characters)" in why, why
    assert weak_password_warning(settings(users={"bob": GOOD})) is None


def test_up_says_exactly_whether_the_page_has_login(page_without_engine: Callable[..., ChatPage]) -> None:
    """What ``up`` prints about the login is what the page decided: users without a cookie secret on
    loopback make an open page, and ``up`` says so."""
    users = {"ann": GOOD}
    open_page = page_without_engine(ERNIECHAT_APP__USERS=json.dumps(users))
    assert not httpx.get(open_page.url + "/auth/config", timeout=10).json()["requireLogin"]
    note = login_note(settings(users=users), environ={})
    assert note.startswith("note: the page has NO login: app.users is set but there is no secret"), note
    closed = page_without_engine(ERNIECHAT_APP__USERS=json.dumps(users), ERNIECHAT_APP__AUTH_SECRET=SECRET)
    assert httpx.get(closed.url + "/auth/config", timeout=10).json()["requireLogin"] is True
    assert login_note(settings(users=users, auth_secret=SECRET), environ={}) == "note: the page has login (users: ann)"
    assert login_note(settings(users=users), environ={SECRET_ENV: SECRET}) == "note: the page has login (users: ann)"
    assert "has no login (no app.users)" in login_note(settings(), environ={})


class Clock:
    """Time for the throttle, moved by hand: the windows are minutes long."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_lock_the_name_and_the_address_for_a_doubling_window() -> None:
    clock = Clock()
    throttle = LoginThrottle(free=3, first_lock_s=2.0, max_lock_s=10.0, forget_s=60.0, clock=clock)
    s = settings(users={"ann": GOOD, "bob": GOOD})

    def attempt(name: str, password: str, address: str = "10.0.0.1") -> bool | float:
        try:
            return check_login(s, throttle, name, password, address)
        except TooManyLogins as refused:
            return float(refused.retry_after)

    assert [attempt("ann", "guess") for _ in range(3)] == [False, False, False]
    assert attempt("ann", GOOD) == 2.0, "locked for 2 s after the third failure, even for the right password"
    assert attempt("ann", GOOD, "10.0.0.2") == 2.0, "the name is locked from every address"
    assert attempt("bob", GOOD, "10.0.0.1") == 2.0, "and the address for every name"
    assert attempt("bob", GOOD, "10.0.0.2") is True, "nobody else waits"
    clock.now += 2.0
    assert attempt("ann", "guess") is False
    assert attempt("ann", GOOD) == 4.0, "each further failure doubles the window"
    clock.now += 4.0
    assert attempt("ann", "guess") is False
    clock.now += 8.0
    assert attempt("ann", "guess") is False
    assert attempt("ann", GOOD) == 10.0, "at most max_lock_s"
    clock.now += 10.0
    assert attempt("ann", GOOD) is True, "the right password works once the window has passed"
    assert attempt("ann", "guess", "10.0.0.3") is False and attempt("ann", GOOD, "10.0.0.3") is True, (
        "a good login clears the name's failures"
    )
    clock.now += 61.0
    assert [attempt("carl", "guess", "10.0.0.1") for _ in range(2)] == [False, False], "old failures are forgotten"


@contextmanager
def login_from(page: ChatPage, address: str) -> Iterator[Callable[[str, str], httpx.Response]]:
    """POST /login as the browser does, from the client address ``address`` (127.0.0.0/8 is this machine)."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60) as http:
        yield lambda name, password: http.post(page.url + "/login", data={"username": name, "password": password})


def guessed(attempt: Callable[[int], httpx.Response], n: int = 20) -> list[httpx.Response]:
    """``n`` wrong logins at once, one after the other; at most 5 (the free failures) and one per lock
    window that could pass meanwhile (1 s, doubled per failure) are checked, the rest refused."""
    t0 = time.monotonic()
    said = [attempt(i) for i in range(n)]
    elapsed = time.monotonic() - t0
    checked = [r.status_code for r in said].count(401)
    refused = [r for r in said if r.status_code == 429]
    assert checked + len(refused) == n, [r.status_code for r in said]
    assert 5 <= checked <= 5 + math.log2(elapsed + 1), f"{checked} of {n} guesses checked in {elapsed:.1f} s"
    assert refused, "no guess was refused"
    for r in refused:
        wait = int(r.headers["retry-after"])
        assert r.json()["detail"] == f"Too many failed logins; try again in {wait} s." and wait >= 1
    return said


def test_guessed_passwords_are_slowed_per_address_and_per_user(page_without_engine: Callable[..., ChatPage]) -> None:
    """Guessing over HTTP against a real page: from one address (any names), and for one name (from
    ever new addresses). Other people log in meanwhile, and the guessed user once the window is over."""
    page = page_without_engine(ERNIECHAT_APP__USERS=json.dumps({"ann": GOOD, "bob": GOOD}), **{SECRET_ENV: SECRET})
    with login_from(page, "127.0.0.3") as elsewhere:
        with login_from(page, "127.0.0.2") as one_address:
            guessed(lambda i: one_address(f"user{i}", "guess"))
        assert elsewhere("bob", GOOD).status_code == 200, "another address is not held up"

        def new_address(i: int) -> httpx.Response:
            with login_from(page, f"127.0.1.{i + 1}") as attempt:
                return attempt("ann", "guess")

        said = guessed(new_address)
        assert elsewhere("bob", GOOD).status_code == 200, "another user is not held up"
        wait = int(said[-1].headers.get("retry-after", "0"))
        for _ in range(10):  # the right password, once the name's window is over
            time.sleep(wait)
            good = elsewhere("ann", GOOD)
            if good.status_code != 429:
                break
            wait = int(good.headers["retry-after"])
        assert good.status_code == 200 and "access_token" in good.headers.get("set-cookie", "")
