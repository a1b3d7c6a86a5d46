"""Several page processes behind one port, for hosts where one Chainlit event loop is the ceiling.

One Chainlit process sets up every message on one event loop: at 64 chats at once on an H200 host
the page delivered 0.57-0.71x direct's tokens/s, the gap all first-token time queued on that loop
(BENCHMARKS.md, "the page at GPU speed"). Chainlit keeps each chat's session in its process's
memory, and the browser reaches that session over the socket and over plain HTTP (Retry is a
``POST /project/action`` with the session's id), so every connection from one client address
goes to one process (sticky by address, as nginx's ``ip_hash``), new addresses to the processes in
turn. The front only accepts a connection and hands its socket to that process (``SCM_RIGHTS``):
no byte of a chat passes through it, so it adds no copy and no delay per token. A client behind
one address (a proxy, a container's port forward) gets one process: the same as without a front.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict

import uvicorn

READY = b"ready"
REMEMBERED_ADDRESSES = 65536
"""Client addresses kept with their process; the oldest is forgotten (and placed anew) beyond this."""


class Placement:
    """Client address -> page process: the same process while remembered, new ones in turn."""

    def __init__(self, workers: int, remember: int = REMEMBERED_ADDRESSES) -> None:
        self.workers = workers
        self.remember = remember
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._next = 0

    def place(self, address: str) -> int:
        if address in self._seen:
            self._seen.move_to_end(address)
            return self._seen[address]
        worker, self._next = self._next, (self._next + 1) % self.workers
        self._seen[address] = worker
        if len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        return worker


def run_front(target: str, host: str, port: int, workers: int) -> int:
    """Bind ``host:port``, start ``workers`` page processes, listen once all are up, then hand
    each connection to its process until a signal stops the front (0) or one of the processes
    exits by itself (1); either way every process is stopped."""
    listener = _bind(host, port)
    channels: list[socket.socket] = []
    procs: list[subprocess.Popen[bytes]] = []
    for _ in range(workers):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "backend.page.launch", target, "--host", host, "--port", str(port)]
        procs.append(subprocess.Popen([*argv, "--channel-fd", str(theirs.fileno())], pass_fds=[theirs.fileno()]))
        theirs.close()
        channels.append(mine)
    stopping = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        stopping.set()
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signum)
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes accept()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    died: list[str] = []

    def watch() -> None:
        """The first process to exit stops the front: a page with a dead share of its users
        must not look healthy (``up`` sees the front exit and says so)."""
        pid, status = os.wait()
        if not stopping.is_set():
            died.append(f"chat page: process {pid} exited (code {os.waitstatus_to_exitcode(status)}); stopping")
            print(died[0], flush=True)
            stop(signal.SIGTERM, None)

    threading.Thread(target=watch, daemon=True).start()
    for ch in channels:  # each says when its uvicorn runs; until all have, the port refuses connections
        if ch.recv(16) != READY:
            stop(signal.SIGTERM, None)
    if not stopping.is_set():
        listener.listen(2048)
        print(f"chat page: {workers} processes on http://{host}:{port} (each client address on one)", flush=True)
    placement = Placement(workers)
    while not stopping.is_set():
        try:
            conn, addr = listener.accept()
        except OSError:
            break
        with conn:
            worker = placement.place(str(addr[0]))
            with contextlib.suppress(OSError):  # a process gone: the watcher is stopping the front
                socket.send_fds(channels[worker], [b"c"], [conn.fileno()])
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        if p.poll() is None:
            p.kill()
    return 1 if died else 0


def _bind(host: str, port: int) -> socket.socket:
    """Bound, not listening: the port is taken at once (a clash fails here), but connections are
    refused until every process can answer them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise SystemExit(f"error: cannot listen on {host}:{port}: {err}") from None
    return sock


class HandedServer(uvicorn.Server):
    """uvicorn serving the connections the front hands over on ``channel`` (it listens on no port
    itself: an abstract Unix socket nobody knows stands in for one)."""

    def __init__(self, config: uvicorn.Config, channel: socket.socket) -> None:
        super().__init__(config)
        self.channel = channel
        self._tasks: set[asyncio.Task[object]] = set()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        stand_in = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stand_in.bind(f"\0erniechat-page-{os.getpid()}")
        stand_in.listen()
        await super().serve(sockets=[stand_in])

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit:
            return
        loop = asyncio.get_running_loop()
        # uvicorn types http_protocol_class as type[asyncio.Protocol]; its classes take these keywords
        # (uvicorn's own server.py ignores call-arg on the same call)
        protocol = functools.partial(  # type: ignore[call-arg]
            self.config.http_protocol_class,
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        self.channel.setblocking(False)
        loop.add_reader(self.channel.fileno(), self._receive, loop, protocol)
        self.channel.send(READY)

    def _receive(self, loop: asyncio.AbstractEventLoop, protocol: functools.partial[asyncio.Protocol]) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.channel, 16, 16)
        except BlockingIOError:
            return
        if not data and not fds:  # the front is gone: so is the port; stop
            loop.remove_reader(self.channel.fileno())
            self.should_exit = True
            return
        for fd in fds:
            conn = socket.socket(fileno=fd)
            conn.setblocking(False)
            task = loop.create_task(loop.connect_accepted_socket(protocol, conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
