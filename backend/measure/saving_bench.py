"""What saving streaming replies every second costs the page: ``python -m backend.measure.saving_bench``.

The page's own chat store and saver (``backend/page/chats``: ``ChatStore``, ``PartialSaver``) on a real
database (a fresh SQLite file, or ``--database-url``), with ``--chats`` replies streaming at once on one
event loop as a page process runs them: each grows by a piece of text every ``--piece-ms`` (the page's
stream joining), ``--tokens-per-s`` tokens a second of about four characters each. The same streams run
twice, without and with the saves, and each run reports the process's CPU (the database driver's thread
included), how late a 10 ms timer on the event loop fires (what a token waiting to go out meets), and,
with the saves, each save's transaction time. JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chainlit as cl
from chainlit.context import init_http_context
from chainlit.user import User

from backend.measure.stats import percentile
from backend.page.chats.database import async_url, shown
from backend.page.chats.partial import SAVE_EVERY_S, PartialRow
from backend.page.chats.schema import ensure_schema
from backend.page.chats.store import ChatStore

WORD = "word"
PROBE_S = 0.010


@dataclass
class Run:
    """One run's figures."""

    cpu_s: float
    wall_s: float
    lag_ms: list[float]
    save_ms: list[float]
    rows: int

    def summary(self) -> dict[str, Any]:
        lag = sorted(self.lag_ms)
        saves = sorted(self.save_ms)
        return {
            "cpu_s": round(self.cpu_s, 3),
            "cpu_share_of_a_core": round(self.cpu_s / self.wall_s, 4),
            "loop_lag_ms": {"p50": _ms(lag, 50), "p99": _ms(lag, 99), "max": round(max(lag, default=0.0), 2)},
            "saves": len(saves),
            "rows_written": self.rows,
            "save_ms": {"p50": _ms(saves, 50), "p99": _ms(saves, 99), "max": round(max(saves, default=0.0), 2)},
        }


def _ms(values: list[float], p: float) -> float | None:
    value = percentile(values, p)
    return None if value is None else round(value, 2)


async def _chats(store: ChatStore, n: int) -> list[cl.Message]:
    """``n`` chats of one user, each a question and the empty reply the page shows first; the replies."""
    user = await store.create_user(User(identifier=f"bench-{uuid.uuid4().hex[:8]}"))
    assert user is not None
    replies = []
    for i in range(n):
        thread, question = str(uuid.uuid4()), str(uuid.uuid4())
        await store.update_thread(thread, name=f"chat {i}", user_id=user.id)
        await store.create_step({"id": question, "threadId": thread, "type": "user_message", "output": "Tell me."})
        reply = cl.Message(content="", metadata={"in_reply_to": question})
        reply.thread_id = thread
        await store.create_step(reply.to_dict())
        replies.append(reply)
    assert await store.writer.flush()
    return replies


async def _run(store: ChatStore, replies: list[cl.Message], seconds: float, save: bool, args: Any) -> Run:
    """Stream into ``replies`` for ``seconds`` (saving them every second when ``save``)."""
    for reply in replies:
        reply.content = ""
        if save:
            store.keep_saving(reply)
    piece = " ".join([WORD] * max(1, round(args.tokens_per_s * args.piece_ms / 1000)))
    lag: list[float] = []
    timed: list[float] = []
    rows = [0]
    real_save = store.save_partials

    async def timed_save(batch: list[PartialRow]) -> set[str]:
        t0 = time.perf_counter()
        done = await real_save(batch)
        timed.append((time.perf_counter() - t0) * 1000)
        rows[0] += len(done)
        return done

    store.partials.save = timed_save
    stop = time.monotonic() + seconds

    async def stream(reply: cl.Message, offset: float) -> None:
        await asyncio.sleep(offset)
        while time.monotonic() < stop:
            reply.content += piece + " "
            await asyncio.sleep(args.piece_ms / 1000)

    async def probe() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            lag.append((time.perf_counter() - t0 - PROBE_S) * 1000)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    spread = args.piece_ms / 1000 / max(1, len(replies))
    await asyncio.gather(probe(), *(stream(r, i * spread) for i, r in enumerate(replies)))
    for reply in replies:
        store.partials.untrack(reply.id)
    assert await store.writer.flush()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    store.partials.save = real_save
    return Run(cpu, wall, lag, timed, rows[0])


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="erniechat-saving-") as tmp:
        url = async_url(args.database_url or f"sqlite:///{Path(tmp) / 'chats.db'}")
        await ensure_schema(url)
        init_http_context()
        store = ChatStore(url)
        try:
            replies = await _chats(store, args.chats)
            runs: dict[str, list[dict[str, Any]]] = {}
            for save in (False, True) * args.rounds:
                run = await _run(store, replies, args.seconds, save, args)
                runs.setdefault("with" if save else "without", []).append(run.summary())
        finally:
            await store.close()
    first = {k: v[0] for k, v in runs.items()}
    added = [
        w["cpu_share_of_a_core"] - o["cpu_share_of_a_core"] for w, o in zip(runs["with"], runs["without"], strict=True)
    ]
    return {
        "database": "sqlite (a fresh file)" if not args.database_url else shown(url),
        "chats": args.chats,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "save_every_s": SAVE_EVERY_S,
        "tokens_per_s_per_chat": args.tokens_per_s,
        "piece_ms": args.piece_ms,
        "text_at_end_chars": len(replies[0].content) if replies else 0,
        "added_cpu_share_of_a_core": [round(a, 4) for a in added],
        "first_round": first,
        "rounds_detail": runs,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m backend.measure.saving_bench", description=__doc__.splitlines()[0])
    p.add_argument("--chats", type=int, default=64)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2, help="pairs of runs, without and with the saves")
    p.add_argument("--tokens-per-s", type=float, default=60.0, help="per chat")
    p.add_argument("--piece-ms", type=float, default=30.0, help="the page's stream joining (app.stream_interval_ms)")
    p.add_argument("--database-url", default=None, help="postgresql://... (default: a fresh SQLite file)")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
