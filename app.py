"""The chat page: Chainlit handlers that talk to people and to the engine's API.

Where the engine is, timeouts, history that fits, streaming and the live plan live in
``backend/page/``; the Chainlit internals it touches (socket pings, the readme's root, the
session's task) in ``backend/page/chainlit_internals.py``. This file turns them into
messages. Start it with ``python -m backend up`` (or ``python -m backend.page.launch app.py``, or
``chainlit run app.py``, beside a running ``python -m backend serve``).
"""

import asyncio
import contextlib
import os
import time
import traceback

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.input_widget import Slider, TextInput
from chainlit.types import ThreadDict
from fastapi import HTTPException

from backend.engine_api import ChatResult
from backend.errors import ChatError, EngineDown, EngineTimeout, ErniechatError, TooLong
from backend.page import auth, panel
from backend.page import chainlit_internals as internals
from backend.page.chats.export import EXPORT_COMMAND, is_export, send_export
from backend.page.chats.identity import local_user_applies, use_identity
from backend.page.chats.interrupted import offer_retries, retry_action
from backend.page.chats.opening import not_saved_notice, open_chats
from backend.page.chats.resume import history_of, remember
from backend.page.compare import Setup, Setups, begin, switches
from backend.page.history import valid_text
from backend.page.latency import AllChats, EngineStarts, received_at
from backend.page.link import EngineLink, Target
from backend.page.render import footer, progress_line, render_page, with_footer, write_if_changed
from backend.page.sampling import checked, knobs, sampling_from
from backend.page.stream import stream_reply
from backend.runtime.status import EngineStatus
from config.settings import ROOT, load_settings

settings = load_settings()
link = EngineLink(settings)
setups = Setups(link)  # the plan's link, and the compared setup's beside it (up --compare)
internals.set_socket_pings(settings.app.ping_interval_s, settings.app.ping_timeout_s)
internals.set_max_message_bytes(16 * 1024 * 1024)  # a paste up to uvicorn's own websocket cap reaches the page
internals.only_allowed_origins(settings.app.allowed_origins)  # no other web page reads the chats
internals.guard_socket_events()  # whatever a script sends on the socket is answered in words
TEMPLATE = (ROOT / "chainlit.md").read_text(encoding="utf-8")
PAGE = link.run_dir.page_dir
internals.own_files_folder(PAGE / f"files-{os.getpid()}")  # one per page process: each removes its own
all_chats, engine_starts = AllChats(), EngineStarts()  # for `/latency all` and a reply's "first after start"
DEMO = "⚠️ **Demo model: random weights.** Answers are noise; serve real weights with `--model`."
STARTERS = [
    ("Explain attention", "Explain self-attention in a transformer in three short paragraphs."),
    ("Write a haiku", "Write a haiku about a river in winter."),
    ("Plan a trip", "Plan a relaxed two-day trip to Kyoto with one museum a day."),
    ("Python help", "Show a Python function that removes duplicates from a list but keeps their order."),
]


def refresh_page() -> None:
    write_if_changed(PAGE / "chainlit.md", render_page(TEMPLATE, link.status(), link.run_dir))


try:
    refresh_page()
    internals.serve_readme_from(PAGE)
except OSError as err:  # an unwritable run dir: the template is still a fine page
    print(f"chat page: cannot write {PAGE} ({err}); chainlit.md shows no live plan")


async def keep_page_fresh() -> None:
    while True:
        await asyncio.sleep(2)
        with contextlib.suppress(OSError):
            refresh_page()


@cl.on_app_startup
async def startup() -> None:
    internals.in_background(keep_page_fresh())


try:
    login_on = auth.enable_login(settings, internals.bind_host())
except ErniechatError as err:  # exposed without a good login: the page does not start, and says how to set it
    raise SystemExit(f"error: {err}") from None
if weak := auth.weak_password_warning(settings):
    print(f"chat page: {weak}", flush=True)

if login_on:
    throttle = auth.LoginThrottle()

    async def login(username: str, password: str) -> cl.User | None:
        """A user's login; refused unchecked (HTTP 429, with Retry-After) while the name or the client's
        address is locked after failed logins."""
        try:
            good = auth.check_login(settings, throttle, username, password, internals.client_address())
        except auth.TooManyLogins as err:
            raise HTTPException(429, str(err), headers={"Retry-After": str(err.retry_after)}) from None
        return cl.User(identifier=username, metadata={"provider": "password"}) if good else None

    internals.use_password_login(login)

store = open_chats(settings)  # the page chats unsaved, and says so, when the database fails
internals.watch_message_tasks(store.hold)  # writes wait from a message's arrival, not from on_message
internals.run_after_resume()  # a reopened chat's cut-off replies get their Retry once the tab shows them
use_identity(local_user_applies(settings, internals.bind_host(), login_on))
panel.COMMANDS.append(EXPORT_COMMAND)


@cl.set_starters
async def starters(user: cl.User | None = None, language: str | None = None) -> list[cl.Starter]:
    return [cl.Starter(label=label, message=message) for label, message in STARTERS]


class Progress:
    """One message that follows the engine's start-up while a chat waits for it."""

    def __init__(self, lead: str) -> None:
        self.lead = lead
        self.msg: cl.Message | None = None

    async def show(self, status: EngineStatus) -> None:
        text = f"{self.lead}\n\n{progress_line(status)}"
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
async def start(history: list[dict[str, str]] | None = None, compared: list[dict[str, str]] | None = None) -> None:
    """A new chat, or (``history`` given) a reopened one going on with the model's history rebuilt
    (``compared``: the compared setup's, ``up --compare``)."""
    cl.user_session.set("history", history or [])
    begin(compared)
    if notice := not_saved_notice(store):
        await cl.Message(content=notice).send()
    a = settings.app
    await cl.ChatSettings(
        [
            *(
                Slider(id=k.key, label=k.label, initial=getattr(a, k.key), min=k.low, max=k.high, step=k.step)
                for k in knobs(settings)
            ),
            TextInput(id="system_prompt", label="System prompt", initial=a.system_prompt, multiline=True),
            *switches(link.status()),
        ]
    ).send()
    await panel.announce()
    status = link.status()
    await setups.prepare(status)
    if status and status.demo and history is None:
        plan = f"Plan: {status.plan_summary} · Hardware: {status.hardware} · the Readme says why."
        await cl.Message(content=f"{DEMO}\n\n{plan}").send()
    if status is None or status.state == "ready":
        await link.prepare(link.locate(status))  # the window and template cost, before the first message
    else:
        waiting = Progress("The engine is starting; you can type now, your message will wait for it.")
        try:
            await link.prepare(await link.wait_ready(waiting.show))
            await waiting.close("✅ The engine is ready.")
        except ChatError as err:
            if waiting.msg is None:
                waiting.msg = cl.Message(content="")
                await waiting.msg.send()
            await waiting.close(f"⚠️ {err}")


@cl.on_chat_resume
async def resume(thread: ThreadDict) -> None:
    """A past chat reopened (the sidebar, or a socket's ``threadId``; Chainlit checked it is the user's)."""
    await start(history_of(thread), history_of(thread, compared=True))
    internals.after_resume(offer_retries(thread, store.answering))  # replies the page's death cut off


async def refused(text: str, reply_to: str) -> bool:
    """Say why a message is not sent, and True, when it is empty or a reply is still being written
    in this chat. A script can send either (and a browser reconnecting mid-reply may); two replies
    at once would interleave the history while Stop reaches only the later one."""
    why, running = "", internals.answering()
    if running is not None:
        internals.stop_reaches(running)  # Chainlit made this message's task the one Stop cancels
    if not text.strip():
        why = "This message is empty; nothing was sent to the engine."
    elif running is not None:
        why = "A reply is still being written in this chat: wait for it or press Stop, then send this again."
    if why:
        await cl.Message(content=f"⚠️ {why}", metadata={"in_reply_to": reply_to}).send()
    return bool(why)


async def answer(text: str, reply_to: str, t0: float) -> None:
    """Wait for the engine if it is starting, fit the history, stream the reply with its footer.
    ``t0``: when the message reached the page; the footer's first-token time counts from it."""
    internals.set_answering(asyncio.current_task())
    try:
        with store.reply(reply_to):  # the chat's database writes that can wait, wait until the reply is done
            for n, setup in enumerate(setups.for_message()):  # two compared setups: one after the other
                await answer_one(text, reply_to, t0 if n == 0 else time.perf_counter(), setup)
    finally:
        internals.set_answering(None)


async def answer_one(text: str, reply_to: str, t0: float, setup: Setup) -> None:
    """:func:`answer`'s work for one ``setup``, once the chat is marked as answering. The reply's message
    is made and shown once the engine has the request (Chainlit's ``Message()`` alone blocks the event loop 1 ms)."""
    link, head = setup.link, setup.heading
    history: list[dict[str, str]] = cl.user_session.get(setup.history_key)
    waiting = Progress("⏳ Your message waits until the engine is ready.")
    reply: cl.Message | None = None
    result, sent = ChatResult(), False
    target: Target | None = None

    def made() -> cl.Message:
        nonlocal reply
        reply = reply or cl.Message(content=head, metadata={"in_reply_to": reply_to, **setup.metadata})
        return reply

    async def show_reply() -> None:  # the empty reply, while the engine works on the request
        nonlocal sent
        sent = bool(await made().send())
        store.keep_saving(made())  # its text so far is saved every second while it streams

    async def on_token(piece: str) -> None:
        await made().stream_token(piece)

    try:
        target = await link.wait_ready(waiting.show)
        await waiting.close("✅ The engine is ready; answering.")
        sampling = sampling_from(cl.user_session.get("chat_settings") or {}, settings)
        fitted = await link.fit(target, history, text, sampling)
        await stream_reply(
            link,
            target,
            fitted.messages,
            sampling,
            on_token,
            result,
            t0,
            cl.context.session.id,
            fitted.prompt_tokens,
            on_accepted=show_reply,
        )
    except asyncio.CancelledError:  # Stop: the engine's stream is closed already; keep what was said
        await waiting.close("Stopped waiting for the engine.")
        if result.text:
            remember(history, made(), text, result.text, len(head))
        if sent:
            reply = made()
            split = panel.keep_timing(reply, result, target, all_chats, engine_starts, stopped=True, setup=setup.label)
            reply.content = with_footer(head + result.text, footer(result, stopped=True, split=split))
            await reply.update()
        raise
    except TooLong as err:
        await cl.Message(content=str(err)).send()
    except ChatError as err:
        await waiting.close("The engine did not get ready for this message.")
        later = " (once the engine is back)" if isinstance(err, (EngineDown, EngineTimeout)) else ""
        why = str(err) + (await link.what_stopped() if isinstance(err, EngineDown) else "")
        await show_failure(made(), sent, result, text, reply_to, why, err.retry, later, head)
    except Exception:  # a defect of the page's own: said in the chat (else hidden), message kept
        traceback.print_exc()
        await waiting.close("This message failed.")
        why = "The page itself failed on this message (a fault of its own, not of the engine); its log has the details."
        await show_failure(made(), sent, result, text, reply_to, why, retry=True, when="", head=head)
    else:
        reply = made()
        remember(history, reply, text, result.text, len(head))
        note = ""
        if fitted.dropped_turns:
            n = fitted.dropped_turns
            note = f"{n} earlier turn{'s' if n > 1 else ''} left out to fit the {fitted.window:,}-token context"
        split = panel.keep_timing(reply, result, target, all_chats, engine_starts, setup=setup.label)
        line = footer(result, split=split) + (" · demo model: random weights" if target.demo else "")
        reply.content = with_footer(head + result.text, line, note)
        await reply.update()


async def show_failure(
    reply: cl.Message,
    sent: bool,
    result: ChatResult,
    text: str,
    reply_to: str,
    why: str,
    retry: bool,
    when: str,
    head: str = "",
) -> None:
    """The reply says why it failed, after ``head`` (its setup's name) and what had arrived; with Retry
    when resending can help."""
    again = retry_action(text, reply_to)
    hint = f" Press **Retry** to send your message again{when}." if retry else ""
    reply.content = head + (f"{result.text}\n\n" if result.text else "") + f"⚠️ {why}{hint}"
    reply.actions = [again] if retry else []
    await (reply.update() if sent else reply.send())


@cl.on_chat_end
async def on_chat_end() -> None:
    """The socket closed. Chainlit keeps the session (and a reply still streaming) for a
    reconnect; if none comes within ``app.abandoned_reply_s``, stop the reply like Stop would.
    "New chat" clears the session first: nothing will reconnect to it, so stop at once."""
    running = internals.running_reply()
    if running is None:
        return
    internals.in_background(internals.stop_when_abandoned(*running, settings.app.abandoned_reply_s))


@cl.on_stop
async def on_stop() -> None:
    internals.stop_missed_reply()


@internals.on_settings_update
async def settings_update(values: dict[str, object]) -> None:
    """Keep the chat settings within the sliders' ranges, and say what a script's values were turned
    into (the sliders themselves send none out of range)."""
    clean, said = checked(values, cl.user_session.get("checked_settings") or {}, settings)
    chat_settings: dict[str, object] = cl.user_session.get("chat_settings")
    chat_settings.update(clean)
    cl.user_session.set("checked_settings", dict(chat_settings))
    for sentence in said:
        await cl.Message(content=f"⚠️ {sentence}").send()


@cl.on_message
async def on_message(message: cl.Message) -> None:
    t0, text = received_at(message.created_at), valid_text(message.content)
    if (args := panel.latency_args(message)) is not None:
        if (running := internals.answering()) is not None:
            internals.stop_reaches(running)  # Stop still reaches the reply being written
        await panel.show(args, all_chats)
        return
    if is_export(message):
        await send_export(chat_context.get(), f"Chat {cl.context.session.thread_id}")
        return
    if not await refused(text, message.id):
        await answer(text, message.id, t0)


@cl.action_callback("retry")
async def retry(action: cl.Action) -> None:
    """Resend the kept message, as the session's task so that Stop reaches it too."""
    text, reply_to = action.payload.get("text"), action.payload.get("reply_to", "")
    if not isinstance(text, str):  # not a Retry this page made (a script's): nothing to resend
        return
    text = valid_text(text)
    if await refused(text, reply_to):  # the Retry stays, for once the running reply is done
        return
    internals.set_answering(asyncio.current_task())  # before any await: a message meanwhile is refused
    t0 = time.perf_counter()

    async def again() -> None:
        internals.set_answering(asyncio.current_task())  # the reply's own task, which Stop cancels
        await action.remove()
        await answer(text, reply_to, t0)

    await internals.run_as_session_task(again)
