"""Exposed means login (backend/page/auth.py): a page beyond loopback refuses to start without it.

The rules as functions, then the two places that enforce them as a person meets them: ``up``
(before any engine starts) and app.py at import, started either way (``chainlit run app.py --host ...``
or the project's ``backend.page.launch``). No test
here listens beyond loopback: the refusals happen before anything binds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from support.services import ROOT, BackendProcess, backend_env

from backend.page.auth import SECRET_ENV, enable_login, exposed_without_login, is_loopback
from config.errors import SettingsError
from config.settings import Settings

if TYPE_CHECKING:
    from backend.runtime.up import ChatPage


SECRET = "x" * 48


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

    users_only = exposed_without_login(settings(host="0.0.0.0", users={"ann": "pw"}), environ={})
    assert users_only and "no secret" in users_only and "no users" not in users_only
    blank = exposed_without_login(settings(host="0.0.0.0", users={"ann": ""}, auth_secret=SECRET), environ={})
    assert blank and "an empty password for ann" in blank


def test_secret_from_the_environment_or_the_settings() -> None:
    exposed = settings(host="0.0.0.0", users={"ann": "pw"})
    assert exposed_without_login(exposed, environ={SECRET_ENV: SECRET}) is None
    exposed.app.auth_secret = SECRET
    assert exposed_without_login(exposed, environ={}) is None


def test_enable_login_refuses_when_exposed_and_hands_the_secret_to_chainlit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "")  # recorded, so the value set below is undone after the test
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(SettingsError, match="needs a password login"):
        enable_login(settings(), "0.0.0.0")
    assert enable_login(settings(users={"ann": "pw"}), "127.0.0.1") is False  # no secret: open, as before
    assert enable_login(settings(users={"ann": "pw"}, auth_secret=SECRET), "0.0.0.0") is True
    assert os.environ[SECRET_ENV] == SECRET


@pytest.mark.parametrize("how", ["flag", "env"])
def test_up_refuses_an_exposed_page_without_login_before_the_engine_starts(tmp_path: Path, how: str) -> None:
    args, env = (["--host", "0.0.0.0"], {}) if how == "flag" else ([], {"ERNIECHAT_APP__HOST": "0.0.0.0"})
    up = BackendProcess(["up", "--model", "demo", *args], backend_env(tmp_path, **env)).start()
    assert up.wait(120) == 2
    out = up.output()
    assert "error: the chat page would listen on 0.0.0.0" in out and "ERNIECHAT_APP__USERS=" in out, out
    assert not (tmp_path / "status.json").exists(), "no engine may start"
    assert "plan:" not in out, "refused before planning, let alone starting an engine"


@pytest.mark.parametrize(
    "start",
    [["chainlit", "run", "app.py", "--headless"], ["backend.page.launch", "app.py"]],
    ids=["chainlit-run", "launch"],
)
def test_the_page_refuses_to_be_exposed_without_login(tmp_path: Path, start: list[str]) -> None:
    env = backend_env(tmp_path)
    env.pop(SECRET_ENV, None)
    argv = [sys.executable, "-m", *start, "--host", "0.0.0.0", "--port", "1"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "the chat page would listen on 0.0.0.0" in done.stderr, done.stderr[-2000:]


def test_secret_from_the_settings_turns_login_on(page_without_engine: Callable[..., ChatPage]) -> None:
    page = page_without_engine(ERNIECHAT_APP__USERS='{"ann": "s3cret"}', ERNIECHAT_APP__AUTH_SECRET=SECRET)
    assert httpx.get(page.url + "/auth/config", timeout=10).json()["requireLogin"] is True
    good = httpx.post(page.url + "/login", data={"username": "ann", "password": "s3cret"}, timeout=10)
    assert good.status_code == 200 and "access_token" in good.headers.get("set-cookie", "")
