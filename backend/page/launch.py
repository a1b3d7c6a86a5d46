"""Start the chat page: what ``chainlit run APP --headless`` does, on asyncio's own event loop.

Chainlit's CLI applies ``nest_asyncio`` when it is imported. That swaps asyncio's C Task and
Future for the pure-Python ones and runs each step of the event loop in Python, for
re-entrant loops (``cl.run_sync`` from the loop's own thread), which this page never uses. The
page is one event loop for every chat, so its cost per message and per streamed chunk is its
ceiling at many concurrent chats (BENCHMARKS.md, "the page at GPU speed"). The rest is
Chainlit's own start: config, the app module, the JWT secret check, the readme, uvicorn with
Chainlit's defaults. ``chainlit run app.py`` still works (with its SSL and root-path flags,
which this start does not take). ``--workers N``: N such processes behind one port
(``backend/page/front.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import uvicorn


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m backend.page.launch", description=__doc__.splitlines()[0])
    p.add_argument("target", nargs="?", default="app.py", help="the Chainlit app module (default app.py)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="page processes behind the port, each client address on one (default 1: no front)",
    )
    p.add_argument("--channel-fd", type=int, default=None, help=argparse.SUPPRESS)  # set by the front
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be 1 or more, not {args.workers}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if not os.path.isfile(args.target) or not args.target.endswith(".py"):
        raise SystemExit(f"error: no Chainlit app at {args.target} (a .py file)")
    if args.workers > 1 and args.channel_fd is None:
        from backend.page.front import run_front

        raise SystemExit(run_front(args.target, args.host, args.port, args.workers))
    os.environ["CHAINLIT_HOST"], os.environ["CHAINLIT_PORT"] = args.host, str(args.port)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    from chainlit.auth import ensure_jwt_secret
    from chainlit.config import config, load_module
    from chainlit.markdown import init_markdown

    config.run.headless = True
    config.run.host, config.run.port = args.host, args.port
    from chainlit.server import app

    config.run.module_name = args.target
    load_module(args.target)
    ensure_jwt_secret()
    if not (config.code.on_chat_start or config.code.on_message):
        raise SystemExit(f"error: {args.target} defines neither on_chat_start nor on_message")
    init_markdown(config.root)
    served = uvicorn.Config(app, host=args.host, port=args.port, log_level="error")
    if args.channel_fd is None:
        server = uvicorn.Server(served)
    else:
        import socket

        from backend.page.front import HandedServer

        server = HandedServer(served, socket.socket(fileno=args.channel_fd))
    asyncio.run(server.serve())


if __name__ == "__main__":
    main()
