"""The chat page: Chainlit handlers that talk to people and to the engine's API.

Where the engine is, timeouts, history that fits and streaming live in ``backend/chat.py``;
this file turns them into messages. Start it with ``python -m backend up`` (or
``chainlit run app.py`` beside a running ``python -m backend serve``).

Socket: Chainlit has no config key for the engine.io ping interval/timeout (python-engineio
defaults 25 s / 20 s: a vanished tab would hold its session ~45 s). The server is
``chainlit.server.sio`` (python-socketio AsyncServer); its engine.io server ``sio.eio`` reads
``ping_interval`` / ``ping_timeout`` for each new connection, so they are set here at import.
Websocket-only transport and the shorter ``session_timeout`` are in ``.chainlit/config.toml``.

The plan page: Chainlit reads ``chainlit.md`` from ``config.root`` on every page load. The
tracked ``chainlit.md`` is a template; the app renders it with the live plan from the status
file into ``<engine.run_dir>/page/`` and points ``config.root`` there.
"""

import asyncio
import contextlib
import hmac

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.input_widget import Slider, TextInput
from chainlit.server import sio

from backend import chat
from backend.client import ChatResult
from backend.page import auth
from backend.status import EngineStatus
from config.settings import ROOT, load_settings

settings = load_settings()
link = chat.EngineLink(settings)
sio.eio.ping_interval = settings.app.ping_interval_s
sio.eio.ping_timeout = settings.app.ping_timeout_s
TEMPLATE = (ROOT / "chainlit.md").read_text(encoding="utf-8")
PAGE = settings.engine.run_dir / "page"
DEMO = "⚠️ **Demo model: random weights.** Answers are noise; serve real weights with `--model`."
STARTERS = [
    ("Explain attention", "Explain self-attention in a transformer in three short paragraphs."),
    ("Write a haiku", "Write a haiku about a river in winter."),
    ("Plan a trip", "Plan a relaxed two-day trip to Kyoto with one museum a day."),
    ("Python help", "Show a Python function that removes duplicates from a list but keeps their order."),
]
_background: set[asyncio.Task] = set()


def refresh_page() -> None:
    chat.write_if_changed(PAGE / "chainlit.md", chat.render_page(TEMPLATE, link.status(), link.run_dir))


try:
    refresh_page()
    chainlit_config.root = str(PAGE)
except OSError as err:  # an unwritable run dir: the template is still a fine page
    print(f"chat page: cannot write {PAGE} ({err}); chainlit.md shows no live plan")


async def keep_page_fresh() -> None:
    while True:
        await asyncio.sleep(2)
        with contextlib.suppress(OSError):
            refresh_page()


@cl.on_app_startup
async def startup() -> None:
    task = asyncio.create_task(keep_page_fresh())
    _background.add(task)


if auth.enable_login(settings, chainlit_config.run.host):  # exposed without login: exits, says how to set it

    @cl.password_auth_callback
    async def login(username: str, password: str) -> cl.User | None:
        expected = settings.app.users.get(username)
        if expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
            return cl.User(identifier=username, metadata={"provider": "password"})
        return None


@cl.set_starters
async def starters(user: cl.User | None = None, language: str | None = None) -> list[cl.Starter]:
    return [cl.Starter(label=label, message=message) for label, message in STARTERS]


class Progress:
    """One message that follows the engine's start-up while a chat waits for it."""

    def __init__(self, lead: str) -> None:
        self.lead = lead
        self.msg: cl.Message | None = None

    async def show(self, status: EngineStatus) -> None:
        text = f"{self.lead}\n\n{chat.progress_line(status)}"
        if self.msg is None:
            self.msg = cl.Message(content=text)
            await self.msg.send()
        else:
            self.msg.content = text
            await self.msg.update()

    async def close(self, text: str) -> None:
        """Replace the progress with ``text``, once; later calls do nothing."""
        if self.msg is not None:
            self.msg.content = text
            await self.msg.update()
            self.msg = None


@cl.on_chat_start
async def start() -> None:
    cl.user_session.set("history", [])
    a = settings.app
    await cl.ChatSettings(
        [
            Slider(id="temperature", label="Temperature", initial=a.temperature, min=0, max=2, step=0.05),
            Slider(id="top_p", label="Top-p", initial=a.top_p, min=0.05, max=1, step=0.05),
            Slider(
                id="max_tokens", label="Max tokens (reply)", initial=a.max_tokens, min=16, max=max(4096, a.max_tokens)
            ),
            TextInput(id="system_prompt", label="System prompt", initial=a.system_prompt, multiline=True),
        ]
    ).send()
    status = link.status()
    if status and status.demo:
        plan = f"Plan: {status.plan_summary} · Hardware: {status.hardware} · the Readme says why."
        await cl.Message(content=f"{DEMO}\n\n{plan}").send()
    if status and status.state != "ready":
        waiting = Progress("The engine is starting; you can type now, your message will wait for it.")
        try:
            await link.wait_ready(waiting.show)
            await waiting.close("✅ The engine is ready.")
        except chat.ChatError as err:
            if waiting.msg is None:
                waiting.msg = cl.Message(content="")
                await waiting.msg.send()
            await waiting.close(f"⚠️ {err}")


async def answer(text: str, reply_to: str) -> None:
    """Wait for the engine if it is starting, fit the history, stream the reply with its footer."""
    history: list[dict[str, str]] = cl.user_session.get("history")
    waiting = Progress("⏳ Your message waits until the engine is ready.")
    reply = cl.Message(content="", metadata={"in_reply_to": reply_to})
    result, sent = ChatResult(), False
    try:
        target = await link.wait_ready(waiting.show)
        await waiting.close("✅ The engine is ready; answering.")
        sampling = chat.Sampling.from_values(cl.user_session.get("chat_settings") or {}, settings)
        fitted = await link.fit(target, history, text, sampling)
        sent = bool(await reply.send())
        await link.stream(target, fitted.messages, sampling, reply.stream_token, result)
    except asyncio.CancelledError:  # Stop: the engine's stream is closed already; keep what was said
        await waiting.close("Stopped waiting for the engine.")
        if result.text:
            history += [{"role": "user", "content": text}, {"role": "assistant", "content": result.text}]
        if sent:
            reply.content = chat.with_footer(result.text, chat.footer(result, stopped=True))
            await reply.update()
        raise
    except chat.TooLong as err:
        await cl.Message(content=str(err)).send()
    except chat.ChatError as err:
        await waiting.close("The engine did not get ready for this message.")
        retry = cl.Action(name="retry", payload={"text": text, "reply_to": reply_to}, label="Retry", icon="rotate-ccw")
        hint = " Press **Retry** to send your message again (once the engine is back)." if err.retry else ""
        reply.content = (f"{result.text}\n\n" if result.text else "") + f"⚠️ {err}{hint}"
        reply.actions = [retry] if err.retry else []
        await (reply.update() if sent else reply.send())
    else:
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": result.text}]
        note = ""
        if fitted.dropped_turns:
            n = fitted.dropped_turns
            note = f"{n} earlier turn{'s' if n > 1 else ''} left out to fit the {fitted.window:,}-token context"
        line = chat.footer(result) + (" · demo model: random weights" if target.demo else "")
        reply.content = chat.with_footer(result.text, line, note)
        await reply.update()


@cl.on_chat_end
async def on_chat_end() -> None:
    """The socket closed. Chainlit keeps the session (and a reply still streaming) for a
    reconnect; if none comes within ``app.abandoned_reply_s``, stop the reply like Stop would.
    "New chat" clears the session first: nothing will reconnect to it, so stop at once."""
    session = cl.context.session
    task: asyncio.Task | None = getattr(session, "current_task", None)
    if task is None or task.done():
        return
    gone_sid = session.socket_id

    async def stop_if_still_gone() -> None:
        # "clear_session" and the disconnect are handled as separate tasks: watch for either
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.app.abandoned_reply_s
        while not task.done() and session.socket_id == gone_sid:  # a reconnect moves it to a new sid
            if getattr(session, "to_clear", False) or loop.time() >= deadline:
                task.cancel()
                return
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(stop_if_still_gone())
    _background.add(watcher)
    watcher.add_done_callback(_background.discard)


@cl.on_message
async def on_message(message: cl.Message) -> None:
    await answer(message.content, message.id)


@cl.action_callback("retry")
async def retry(action: cl.Action) -> None:
    """Resend the kept message, as the session's task so that Stop reaches it too."""
    await action.remove()
    ctx = cl.context
    await ctx.emitter.task_start()
    task = asyncio.create_task(answer(action.payload["text"], action.payload.get("reply_to", "")))
    ctx.session.current_task = task
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        await ctx.emitter.task_end()
