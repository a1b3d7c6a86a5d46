"""The page on several processes (``page_processes``, ``backend/page/front.py``): each client
address stays on one process, for its socket and for its HTTP requests (Retry is a POST that
must reach the process holding the session); the page stops as one when any process dies."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import pytest
from support.app_client import FOOTER, ChatClient, footer_of
from support.held import open_streams
from support.page import page_processes

from backend.runtime.processes.groups import group_processes
from backend.runtime.up import ChatPage
from config.settings import ROOT


def port_of(page: ChatPage) -> int:
    return int(page.url.rsplit(":", 1)[1])


def test_each_client_address_stays_on_one_process_for_socket_and_retry(two_process_page: ChatPage) -> None:
    page, port = two_process_page, port_of(two_process_page)
    pids = page_processes(page)
    assert len(pids) == 2, pids
    before = sorted(open_streams(p, port, accepted=True) for p in pids)

    async def run() -> None:
        # new addresses go to the processes in turn: .21 and .22 land on different ones
        a1 = await ChatClient(page.url, source="127.0.0.21").connect()
        b = await ChatClient(page.url, source="127.0.0.22").connect()
        a2 = await ChatClient(page.url, source="127.0.0.21").connect()
        try:
            for tab in (a1, b, a2):
                assert footer_of(await tab.ask(f"Hello. [{uuid.uuid4().hex[:8]}]"))[1] > 0
            held = [open_streams(p, port, accepted=True) for p in pids]
            assert sorted(h - b0 for h, b0 in zip(held, before, strict=True)) == [1, 2], (before, held)

            # Retry is an HTTP POST with the session's id: from the tab's address it reaches the
            # process that holds the session and answers in the tab
            retry = {"name": "retry", "payload": {"text": "Once more, please.", "reply_to": ""}, "label": "Retry"}
            replies = len(b.messages())
            await b.click(retry)
            await b.wait_for(lambda: len(b.messages()) > replies and FOOTER.search(b.messages()[-1]["output"]), 120)
            # the same request from the other address lands on the other process: no such session there
            stray = ChatClient(page.url, session_id=b.session_id, source="127.0.0.21")
            assert (await stray.post_action(retry)).status_code == 500, "the session was found in both processes"
        finally:
            for tab in (a1, b, a2):
                await tab.close()

    asyncio.run(run())


def test_a_page_process_that_dies_stops_the_whole_page(page_without_engine: Callable[..., ChatPage]) -> None:
    page = page_without_engine(workers=2)
    assert page.process.proc is not None and page.process.pid is not None
    pids = page_processes(page)
    assert len(pids) == 2, pids
    os.kill(pids[0], signal.SIGKILL)
    assert page.process.proc.wait(60) == 1
    deadline = time.monotonic() + 30
    while group_processes(page.process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_processes(page.process.pid), "a page process outlived the page"
    assert f"process {pids[0]} exited" in page.tail(), page.tail()


def test_several_processes_on_a_busy_port_or_none_are_refused() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [sys.executable, "-m", "backend.page.launch", "app.py", "--port", str(port), "--workers", "2"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and f"error: cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    argv[-1] = "0"
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--workers must be 1 or more, not 0" in done.stderr, done.stderr


@pytest.mark.parametrize("workers", [2, 3])
def test_new_addresses_go_to_the_processes_in_turn_and_stay(workers: int) -> None:
    from backend.page.front import Placement

    place = Placement(workers, remember=4)
    first = [place.place(f"10.0.0.{i}") for i in range(4)]
    assert first == [i % workers for i in range(4)]
    assert [place.place(f"10.0.0.{i}") for i in range(4)] == first, "a known address moved"
    place.place("10.0.0.9")  # a fifth address: the least recently seen (10.0.0.0) is forgotten
    assert place.place("10.0.0.1") == first[1]
