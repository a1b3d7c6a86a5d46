"""The few Chainlit internals the page relies on, in one place (checked against chainlit 2.12).

- Socket: Chainlit has no config key for the engine.io ping interval/timeout
  (python-engineio defaults 25 s / 20 s: a vanished tab would hold its session ~45 s). Its
  server is ``chainlit.server.sio`` (python-socketio AsyncServer); the engine.io server
  ``sio.eio`` reads ``ping_interval`` / ``ping_timeout`` for each new connection.
- The readme panel: Chainlit reads ``chainlit.md`` from ``config.root`` on every page load.
- Sessions: ``session.current_task`` is the running handler (Stop cancels it),
  ``session.socket_id`` changes when a tab reconnects, and ``session.to_clear`` is set when
  "New chat" clears the session (nothing will reconnect to it).
- Socket events: ``sio.handlers["/"][event]`` is looked up on each event. Chainlit's
  ``client_message`` starts the message's task (``session.current_task``) and returns; that task
  creates the message's steps and asks the data layer for their writes before ``on_message``. Its
  handlers read their payloads as the browser sends them (``guards/socket_checks`` says what each needs).
- Origins: ``chainlit.server`` adds Starlette's ``CORSMiddleware`` with ``project.allow_origins`` and
  credentials to ``app.user_middleware`` at import (the stack is built at the first request), and makes
  its socket.io server with ``cors_allowed_origins=[]`` (no origin check); :func:`only_allowed_origins`
  puts ``backend/page/guards/origins.py`` in its place.
- Reopening: ``connection_successful`` awaits ``on_chat_resume(thread)`` and only then sends the tab
  the chat (``resume_thread``), which replaces the messages the tab shows; :func:`after_resume` runs
  work after that.
- Login: ``/login`` awaits ``config.code.password_auth_callback(username, password)``; the
  decorator ``cl.password_auth_callback`` wraps it so that any exception becomes a failed login
  (401, its traceback in the log). The client's address comes from the request, through an ASGI
  middleware on ``chainlit.server.app``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import chainlit as cl
import socketio
from chainlit.config import config as chainlit_config
from chainlit.context import init_ws_context
from chainlit.server import app, sio
from chainlit.session import WebsocketSession
from chainlit.utils import wrap_user_function

from backend.page.guards.socket_checks import Rule, connect_refusal, rules


def only_allowed_origins(listed: list[str]) -> None:
    """The page's own address and ``listed`` origins only, over HTTP and the socket (``origins``),
    instead of Chainlit's CORS layer. Before the server starts."""
    from starlette.middleware.cors import CORSMiddleware

    from backend.page.guards.origins import OnlyAllowedOrigins

    app.user_middleware = [m for m in app.user_middleware if m.cls is not CORSMiddleware]
    chainlit_config.project.allow_origins = list(listed)
    app.add_middleware(OnlyAllowedOrigins, listed=listed)


def own_feedback_routes(endpoints: dict[str, Callable[..., Any]]) -> None:
    """Put ``endpoints`` (by HTTP method) in place of Chainlit's ``/feedback`` routes, which answer 200
    whatever the data layer did (``chats/feedback``). Chainlit's routes live on ``chainlit.server.router``
    (FastAPI includes it into the app as it is, so a route replaced there is served). Before the server starts."""
    from chainlit.server import router
    from fastapi.routing import APIRoute

    for method, endpoint in endpoints.items():
        at = next(
            i
            for i, route in enumerate(router.routes)
            if isinstance(route, APIRoute) and route.path.endswith("/feedback") and method in (route.methods or set())
        )
        path = router.routes[at].path  # type: ignore[attr-defined]
        router.routes[at] = APIRoute(path, endpoint, methods=[method])


def set_socket_pings(interval_s: float, timeout_s: float) -> None:
    sio.eio.ping_interval = interval_s
    sio.eio.ping_timeout = timeout_s


def set_max_message_bytes(limit: int) -> None:
    """python-engineio drops the socket on a message over 1,000,000 bytes, without a word: a long
    paste vanished. Up to ``limit`` it reaches the page, which says when it does not fit."""
    sio.eio.max_http_buffer_size = limit


def bind_host() -> str:
    """The address the page was started on (``--host``): login is required beyond loopback."""
    return str(chainlit_config.run.host)


def serve_readme_from(directory: Path) -> None:
    """Chainlit reads ``chainlit.md`` from here on each page load."""
    chainlit_config.root = str(directory)


def own_files_folder(directory: Path) -> None:
    """Keep the files this page sends (the latency panel's CSV, exports) in ``directory``, its own:
    Chainlit's default is one ``.files`` folder of the app's root, which every page started from the
    same checkout shares and deletes when it stops, so a file being sent by another page failed."""
    import chainlit.config
    import chainlit.server

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:  # an unwritable run dir: Chainlit's own folder it is
        return
    chainlit.config.FILES_DIRECTORY = directory  # read on each use by the session (its files_dir)
    chainlit.server.FILES_DIRECTORY = directory  # removed at the server's shutdown


def running_reply() -> tuple[Any, asyncio.Task[Any]] | None:
    """The current session and its running handler, if one is still running."""
    session = cl.context.session
    task: asyncio.Task[Any] | None = getattr(session, "current_task", None)
    if task is None or task.done():
        return None
    return session, task


async def stop_when_abandoned(session: Any, task: asyncio.Task[Any], grace_s: float) -> None:
    """Cancel ``task`` once its tab is gone for ``grace_s`` or its session was cleared ("New
    chat"); a reconnect moves the session to a new socket id and keeps the reply."""
    gone_sid = session.socket_id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    # "clear_session" and the disconnect are handled as separate tasks: watch for either
    while not task.done() and session.socket_id == gone_sid:
        if getattr(session, "to_clear", False) or loop.time() >= deadline:
            task.cancel()
            return
        await asyncio.sleep(0.2)


async def run_as_session_task(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` as the session's task, bracketed like a message handler, so Stop reaches it. The
    task exists before the first await: a Stop meanwhile cancels it, and ``task_end`` always follows."""
    ctx = cl.context
    task = asyncio.create_task(work())
    ctx.session.current_task = task
    try:
        await ctx.emitter.task_start()
        await task
    except asyncio.CancelledError:
        task.cancel()  # this handler was cancelled (Stop reached it): so is the work
        await asyncio.wait([task])  # its clean-up (a stopped reply's footer) before task_end
    finally:
        if getattr(ctx.session, ANSWERING, None) in (task, asyncio.current_task()):
            set_answering(None)  # before task_end: a Stop button shown again after it would stay
        await ctx.emitter.task_end()


def stop_reaches(task: asyncio.Task[Any]) -> None:
    """Make ``task`` the one Stop cancels, and keep the Stop button shown while it runs.

    Chainlit points Stop at the latest message's task, so a message refused while a reply runs would
    otherwise leave that reply out of Stop's reach. And the refused message's handler ends with
    Chainlit's ``task_end``, which hides the Stop button while the reply still runs: once that handler
    is done, ``task_start`` shows it again if a reply is still being written (before that reply's own
    ``task_end``: both are sent in the order they are called, and a reply's mark is cleared before its
    ``task_end`` is called)."""
    session = cl.context.session
    session.current_task = task
    handler, emitter = asyncio.current_task(), cl.context.emitter

    async def show_stop_again() -> None:
        if handler is not None:
            await asyncio.wait([handler])
        running: asyncio.Task[Any] | None = getattr(session, ANSWERING, None)
        if running is not None and not running.done():
            await emitter.task_start()

    in_background(show_stop_again())


def stop_missed_reply() -> None:
    """On Stop: cancel the running reply if Chainlit cancelled another task. A Stop that lands
    between a refused message's arrival and its refusal reaches that message's task, not the reply."""
    session = cl.context.session
    running = answering()
    if running is not None and running is not getattr(session, "current_task", None):
        running.cancel()


_background: set[asyncio.Task[Any]] = set()
"""Tasks nobody awaits, kept from the garbage collector until they finish."""


def in_background(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """Run ``work`` as a task nobody awaits (the event loop holds only a weak reference to it)."""
    task = asyncio.create_task(work)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


ANSWERING = "erniechat_answering"
"""The attribute of Chainlit's session object that holds the task writing this chat's reply. On the
session object, not in ``cl.user_session``: "New chat" drops the session, and a late write to
``user_session`` would create its entry again and leave it there."""


def set_answering(task: asyncio.Task[Any] | None) -> None:
    """Mark the task writing this chat's reply (None: no reply is being written)."""
    setattr(cl.context.session, ANSWERING, task)


def answering() -> asyncio.Task[Any] | None:
    """The task writing this chat's reply, while it runs."""
    task: asyncio.Task[Any] | None = getattr(cl.context.session, ANSWERING, None)
    return task if task is not None and not task.done() else None


_client_address: ContextVar[str] = ContextVar("erniechat_client_address", default="")


class _NoteClientAddress:
    """ASGI middleware: the HTTP request's client address, for the login callback (Chainlit gives it
    only the user name and password)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        token = _client_address.set(str(client[0]) if client else "")
        try:
            await self.app(scope, receive, send)
        finally:
            _client_address.reset(token)


def use_password_login(check: Callable[[str, str], Coroutine[Any, Any, cl.User | None]]) -> None:
    """Turn the password login on with ``check``, unwrapped: an HTTPException it raises (429 for too
    many failed logins) is the answer, and :func:`client_address` works in it. Before the server starts."""
    chainlit_config.code.password_auth_callback = check
    app.add_middleware(_NoteClientAddress)


SettingsHandler = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]


def on_settings_update(handler: SettingsHandler) -> SettingsHandler:
    """Chainlit's ``on_settings_update`` without a task around it: a settings change is no reply, so
    it emits no task_start / task_end (the page's Stop button flickered, and a client that waits for
    its message's task_end took the settings' one for it and saw no reply)."""
    chainlit_config.code.on_settings_update = wrap_user_function(handler, with_task=False)
    return handler


def client_address() -> str:
    """The address of the HTTP client being served ('' outside a request)."""
    return _client_address.get()


async def _say(sid: str, text: str) -> None:
    """A message to the chat on socket ``sid`` (none when it is not a chat's socket)."""
    session = WebsocketSession.get(sid)
    if session is None:
        return
    init_ws_context(session)
    await cl.Message(content=f"⚠️ {text}").send()


TOLD = "erniechat_told"
"""The attribute of Chainlit's session object that holds the refusals already said there."""


def guard_socket_events() -> None:
    """Check every socket event Chainlit accepts against ``guards.socket_checks.rules`` before Chainlit's
    handler sees it: a refused one is answered with one sentence (each time, or once per chat for those a
    client sends many of, such as pieces of audio), an event from a socket that is no chat's is dropped,
    and a ``connect`` without a chat page's auth object is refused in words; none reaches Chainlit to fail
    with Python's own words."""
    handlers = sio.handlers["/"]
    features = chainlit_config.features
    audio = bool(features.audio and features.audio.enabled)
    for event, rule in rules(bool(features.edit_message), audio, bool(features.favorites)).items():
        handlers[event] = _guarded(rule, handlers[event])
    chainlit_connect = handlers["connect"]

    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> Any:
        if (why := connect_refusal(auth)) is not None:
            raise socketio.exceptions.ConnectionRefusedError(why)  # python-socketio's own: its words reach the client
        return await chainlit_connect(sid, environ, auth)

    handlers["connect"] = connect


def _guarded(rule: Rule, chainlit: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
    """Chainlit's handler of one event behind ``rule``."""

    async def handle(sid: str, *args: Any) -> Any:
        session = WebsocketSession.get(sid)
        if session is None:
            return None
        payload = (args[0] if len(args) == 1 else args) if rule.payload else None
        why = rule.why_not(payload)
        if why is None:
            return await (chainlit(sid, payload) if rule.payload else chainlit(sid))
        told: set[str] = getattr(session, TOLD, set())
        if rule.every_time or why not in told:
            setattr(session, TOLD, told | {why})
            await _say(sid, why)
        return None

    return handle


AFTER_RESUME = "erniechat_after_resume"
"""The attribute of Chainlit's session object that holds work to run once its chat has been reopened."""


def after_resume(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` once Chainlit has sent the reopened chat to the tab (from ``on_chat_resume``, whose
    own messages and actions the tab would show before the chat and then lose)."""
    session = cl.context.session
    setattr(session, AFTER_RESUME, [*getattr(session, AFTER_RESUME, []), work])


def run_after_resume() -> None:
    """Make :func:`after_resume`'s work run after Chainlit's ``connection_successful``. Before the server starts."""
    handlers = sio.handlers["/"]
    chainlit_connected = handlers["connection_successful"]

    async def connection_successful(sid: str, *args: Any) -> None:
        await chainlit_connected(sid)
        session = WebsocketSession.get(sid)
        waiting: list[Coroutine[Any, Any, None]] = getattr(session, AFTER_RESUME, []) if session else []
        if session is not None and waiting:
            setattr(session, AFTER_RESUME, [])
            init_ws_context(session)
            for work in waiting:
                await work

    handlers["connection_successful"] = connection_successful


def watch_message_tasks(watch: Callable[[asyncio.Task[Any]], None]) -> None:
    """Call ``watch`` with each chat message's task as Chainlit starts it, before its first step:
    Chainlit's own work on a message (its steps and their writes, the chat's first name) comes
    before ``on_message``."""
    handlers = sio.handlers["/"]
    chainlit_message = handlers["client_message"]

    async def client_message(sid: str, *args: Any) -> None:
        session = WebsocketSession.get(sid)
        before = getattr(session, "current_task", None)
        await chainlit_message(sid, *args)
        task: asyncio.Task[Any] | None = getattr(session, "current_task", None)
        if task is not None and task is not before and not task.done():  # a malformed message starts none
            watch(task)

    handlers["client_message"] = client_message
