"""The chat store's writer: the order its writes are done in, and what waiting for them waits for."""

from __future__ import annotations

import asyncio

from backend.page.chats.writer import Writer


def test_waiting_for_the_writes_due_now_waits_for_the_one_being_written() -> None:
    """A write taken off the queue is still being written: a route that waits for the writes due now (a
    feedback's removal, then a second removal of the same id) must not find the queue empty and go on."""

    async def run() -> list[str]:
        writer, order = Writer("a test database"), []
        taken = asyncio.Event()

        async def slow() -> None:
            taken.set()
            await asyncio.sleep(0.2)  # a write that takes a while; the waiter must wait, however long
            order.append("written")

        writer.put(slow, "a removal", now=True)
        await taken.wait()
        assert await writer.due_done()
        order.append("waited")
        return order

    assert asyncio.run(run()) == ["written", "waited"]
