"""The demo image for real: build deploy/Containerfile with Debian's podman, run it, talk to it.

No registry image can be pulled here, so the image is built as ``bash deploy/build.sh
--offline`` builds it: a base made from Debian's packages and wheels downloaded on this host,
both kept between runs (podman's layer cache and ``~/.cache/erniechat``), so only the first
run on a machine pays for them; the build starts in the background once the tests are
collected, and these tests run last (``support.early``). Then, from outside the container and
through the published port only: the exposed page refuses to start without login; with login
(from a mounted settings file) it answers, refuses a socket without the login cookie, streams a reply to one
with it; the health check (``status``) turns healthy; ``podman stop`` ends everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.early import launched_early, take
from support.image import ImageBuild, Podman, can_build, podman_here
from support.ports import free_port
from support.services import EAGER

from backend.page_client import PageError, PageSession

PASSWORD = "tulip-orbit-canvas-41"
"""A login password the page takes beyond loopback."""

READY_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return podman_here(tmp_path_factory)


if not os.environ.get("ERNIECHAT_TEST_IMAGE") and can_build():
    launched_early("image")(ImageBuild.start)


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> str:
    """The image whose build started once the tests were collected (seconds when nothing changed);
    ERNIECHAT_TEST_IMAGE=NAME runs the tests on an image built before, without building."""
    if prebuilt := os.environ.get("ERNIECHAT_TEST_IMAGE"):
        return prebuilt
    return take(request, ImageBuild.start).image()


def container_processes(container_id: str) -> list[str]:
    """Host-side view: processes in the container's cgroup (its PID namespace is visible here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if container_id in (entry / "cgroup").read_text():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_an_exposed_container_without_login_refuses_to_start(podman: Podman, image: str) -> None:
    name = f"erniechat-test-{uuid.uuid4().hex[:8]}"
    try:
        done = podman("run", "--name", name, image, timeout=120, check=False)
        assert done.returncode == 2, done.stdout + done.stderr
        out = done.stdout + done.stderr
        assert "the chat page would listen on 0.0.0.0" in out and "ERNIECHAT_APP__USERS=" in out, out
    finally:
        podman("rm", "--force", "--ignore", "--volumes", name, check=False)  # and its anonymous /data


def login_cookie(url: str, user: str, password: str) -> str:
    resp = httpx.post(url + "/login", data={"username": user, "password": password}, timeout=10)
    assert resp.status_code == 200, resp.text
    return "; ".join(f"{k}={v}" for k, v in resp.cookies.items())


@pytest.fixture
def container(podman: Podman, image: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The demo running with login from a mounted settings file; yields (name, page URL)."""
    name = f"erniechat-test-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-data"
    port = free_port()
    conf = tmp_path / "erniechat.toml"
    secret = uuid.uuid4().hex * 2
    conf.write_text(f'[app]\nusers = {{ ann = "{PASSWORD}" }}\nauth_secret = "{secret}"\nmax_tokens = 24\n')
    conf.chmod(0o644)
    # published on loopback only: nothing here may listen beyond this machine
    podman(
        "run", "--detach", "--name", name,
        "--publish", f"127.0.0.1:{port}:8080",
        "--shm-size", "1g",  # vLLM's shared-memory queues; the default 64 MB stops the engine
        "--volume", f"{volume}:/data",
        "--volume", f"{conf}:/run/erniechat/erniechat.toml:ro",
        "--env", "ERNIECHAT_CONFIG=/run/erniechat/erniechat.toml",
        "--env", "ERNIECHAT_MODEL__ID=demo",
        "--env", "ERNIECHAT_WORKLOAD__USERS=2",
        "--env", "ERNIECHAT_WORKLOAD__CONTEXT=2048",
        "--env", f"ERNIECHAT_ENGINE__EXTRA_ARGS={EAGER}",  # a cold compile in every new container
        image,
    )  # fmt: skip
    try:
        yield name, f"http://127.0.0.1:{port}"
    finally:
        podman("rm", "--force", "--ignore", "--volumes", "--time", "5", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)


def engine_log(podman: Podman, name: str, lines: int = 40) -> str:
    """The error lines and the tail of the engine's log, read from the container's volume."""
    mounts = json.loads(podman("inspect", "--format", "{{json .Mounts}}", name).stdout)
    for mount in mounts:
        if mount.get("Destination") == "/data":
            text = (Path(mount["Source"]) / "run" / "engine.log").read_text(errors="replace").splitlines()
            errors = [line for line in text if "Error" in line and "File " not in line][-10:]
            return "\n".join([*errors, "...", *text[-lines:]])
    return "(no /data volume)"


def wait_for_page(podman: Podman, name: str, url: str) -> None:
    """Until the page answers over the published port and the log has said ``chat:``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        if state != "running":
            logs = podman("logs", name, check=False)
            raise AssertionError(
                f"the container is {state}:\n{(logs.stdout + logs.stderr)[-3000:]}\n"
                f"engine log:\n{engine_log(podman, name)}"
            )
        # `up` prints `chat:` a moment after the page first answers (its first use is paid in
        # between): wait for both, as a user reading the log would.
        try:
            answered = httpx.get(url + "/", timeout=3).status_code == 200
        except httpx.HTTPError:
            answered = False
        if answered and "chat: " in podman("logs", name, check=False).stdout:
            return
        time.sleep(2)
    logs = podman("logs", name, check=False)
    raise AssertionError(f"no page at {url} within {READY_TIMEOUT_S} s:\n{(logs.stdout + logs.stderr)[-4000:]}")


def test_the_demo_container_serves_the_page_with_login_and_stops_clean(
    podman: Podman, container: tuple[str, str]
) -> None:
    name, url = container
    t0 = time.monotonic()
    wait_for_page(podman, name, url)
    print(f"\ncontainer start to page: {time.monotonic() - t0:.0f} s")
    logs = podman("logs", name).stdout
    assert "ready: http://127.0.0.1:8000/v1" in logs and "chat: http://127.0.0.1:8080" in logs, logs[-3000:]

    # The health check is `status`: healthy once the engine has passed warm-up.
    assert podman("healthcheck", "run", name, check=False).returncode == 0
    assert podman("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip() == "healthy"

    # Login is enforced: the page says so, a wrong password and a socket without the cookie fail.
    assert httpx.get(url + "/auth/config", timeout=10).json()["requireLogin"] is True
    bad = httpx.post(url + "/login", data={"username": "ann", "password": "wrong"}, timeout=10)
    assert bad.status_code == 401

    async def chat() -> None:
        with pytest.raises(PageError):
            await PageSession(url).connect(timeout=20)
        tab = await PageSession(url, cookie=login_cookie(url, "ann", PASSWORD)).connect()
        try:
            result = await tab.ask("Say hello in one short sentence.", timeout=180)
        finally:
            await tab.close()
        assert result.error is None, result.error
        assert result.ttft_s is not None and len(result.token_times) >= 2, "the reply must stream"
        assert result.tokens > 0 and result.text

    asyncio.run(chat())

    # What runs inside is visible from the host; after stop, nothing of it is left.
    cid = podman("inspect", "--format", "{{.Id}}", name).stdout.strip()
    inside = container_processes(cid)
    assert any("backend up" in cmd for cmd in inside) and any("vllm" in cmd for cmd in inside), inside
    t_stop = time.monotonic()
    podman("stop", "--time", "60", name, timeout=90)
    stop_s = time.monotonic() - t_stop
    state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
    print(f"stop: {stop_s:.1f} s, exit code {state['ExitCode']}")
    assert state["Status"] == "exited"
    # 143: SIGTERM's own exit, after stopping all; killed at the end of --time it would be 137
    assert state["ExitCode"] == 143, f"`up` must exit on SIGTERM after stopping all (not be killed): {state}"
    assert container_processes(cid) == []
    logs = podman("logs", name).stdout + podman("logs", name).stderr
    assert "Traceback" not in logs, logs[-3000:]
