"""The demo image the container tests run, built in the background from the start of the session.

On a fresh machine the build (a Debian base by mmdebstrap, ~1 GB of wheels, the venv layer) takes
minutes, much of them waiting on the network and on podman committing layers with one core: it is
launched once the tests are collected (``support.early``) and runs beside the rest of the suite; the
container tests, ordered last, find it built.

This machine's podman needs runc, the cgroupfs manager, explicit ulimits and chroot build
isolation: those live in the tests' own containers.conf, not in the Containerfile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.runtime.processes.groups import stop_group
from support.services import ROOT

IMAGE = "localhost/erniechat-test:cpu"
BUILD_TIMEOUT_S = 2400  # a fresh machine: base image, ~1 GB of wheels, the venv layer
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=16384:16384"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


@dataclass
class Podman:
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return done


def podman_here(tmp: pytest.TempPathFactory) -> Podman:
    """Podman with this machine's settings; fails the test when podman or mmdebstrap is missing."""
    if not can_build():
        pytest.fail("podman and mmdebstrap are needed: bash scripts/setup.sh --test installs them")
    conf = tmp.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return Podman({**os.environ, "CONTAINERS_CONF": str(conf), "BUILDAH_ISOLATION": "chroot"})


@dataclass
class ImageBuild:
    """``bash deploy/build.sh --offline`` running in the background; :meth:`image` waits for it."""

    podman: Podman
    proc: subprocess.Popen[str]
    log: Path
    started: float
    """Wall-clock time of the start (the log's last write tells the end)."""

    @classmethod
    def start(cls, tmp: pytest.TempPathFactory) -> ImageBuild:
        podman = podman_here(tmp)
        log = Path(podman.env["CONTAINERS_CONF"]).with_name("build.log")
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["bash", "deploy/build.sh", "--offline", "--tag", IMAGE],
                cwd=ROOT,
                env=podman.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        return cls(podman, proc, log, time.time())

    def image(self) -> str:
        """The built image's name, once the build has ended; its log's tail if it failed."""
        try:
            code = self.proc.wait(max(1.0, BUILD_TIMEOUT_S - (time.time() - self.started)))
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the image build took over {BUILD_TIMEOUT_S} s:\n{self.tail()}") from None
        assert code == 0, f"the image build failed ({code}):\n{self.tail()}"
        size = int(self.podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
        built_s = self.log.stat().st_mtime - self.started
        print(f"\nimage {IMAGE}: built in {built_s:.0f} s (beside the other tests), {size / 2**30:.2f} GiB")
        return IMAGE

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        """End a build still running (the session ended before any container test needed it)."""
        if self.proc.poll() is None:
            stop_group(self.proc.pid, grace_s=60, reap=self.proc.poll)


def can_build() -> bool:
    return shutil.which("podman") is not None and shutil.which("mmdebstrap") is not None
