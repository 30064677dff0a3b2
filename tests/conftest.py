"""Shared fixtures. Every test gets its own data directory and a clean environment (autouse),
so no test can touch the user's real database or depend on the developer's shell."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bot.app import App, build
from bot.config import Config, load_config
from bot.domain import DM_SPACE, ConversationKey
from bot.memory.port import MemoryStore
from bot.memory.store import SqliteStore
from tests import pg_server
from tests.fakes import fake_radio
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

if TYPE_CHECKING:
    from tests.fakes.fake_discord import FakeDiscord


# Tests that take several seconds (mostly waiting: radio airtime, real processes started and
# stopped), longest first; ``pytest_collection_modifyitems`` runs them before all others, so
# that with ``--dist loadgroup`` (pyproject.toml: each test sent to the next free worker) they
# start early and spread over the workers, and the short tests fill in around them: no worker
# ends the run alone on a long one. A stale entry only changes the order. Refresh from
# ``pytest -n 2 --durations=60`` (docs/development.md, "Test suite time").
LONG_FIRST = (
    "tests/test_crash_harness.py::test_no_answer_shown_twice_or_lost",
    "tests/test_crash_harness.py::test_kill_with_questions_waiting",
    "tests/test_crash_commands.py",
    "tests/test_one_slot.py::test_several_people_keeping_the_slot_busy",
    "tests/test_cli.py::test_memory_show_prints_blocks",
    "tests/test_crash_harness.py",
    "tests/test_bench_memory_e2e.py::test_a_dated_replay",
    "tests/test_migrate_store.py::test_cli_killed_mid_copy",
    "tests/test_install_script.py",
    "tests/test_pg_search_plan.py",
    "tests/test_web_browser.py::test_an_open_page_reconnects",
    "tests/test_bad_input.py::test_hanging_llm",
    "tests/test_gateways_once.py",
    "tests/test_one_slot.py",
    "tests/test_cli_manners.py::test_output_to_a_closed_pipe",
    "tests/test_discord_transport.py::test_reconnect_that_cannot_resume",
    "tests/test_discord_app.py::test_meshsage_run",
    "tests/test_meshtastic_e2e.py",
    "tests/test_bench_memory_e2e.py",
    "tests/test_mesh_holds.py",
    "tests/regressions/test_hung_llm_notices_do_not_queue.py",
    "tests/test_health_truth.py::test_an_unexpected_failure_in_discord_py",
    "tests/test_stop_budget.py",
    "tests/test_cli.py",
    "tests/test_migrate_store.py",
    "tests/test_sdnotify.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``LONG_FIRST`` tests first, in its order; the rest after them, in collection order."""

    def rank(item: pytest.Item) -> int:
        for i, prefix in enumerate(LONG_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(LONG_FIRST)

    items.sort(key=rank)  # stable: the order within a rank stays pytest's


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in list(os.environ):
        if var.startswith(("MESHSAGE_", "OPENAI_", "DISCORD_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    yield


@pytest.fixture(autouse=True, scope="session")
def _postgres_server() -> Iterator[None]:
    """The PostgreSQL server some tests start on first use (tests/pg_server.py) stops with the
    session."""
    yield
    pg_server.stop_shared()


@pytest.fixture(autouse=True)
def _on_air_rules() -> Iterator[None]:
    """Suite-wide: every text any fake radio received in this test is <= 200 bytes and spaced
    (``fake_radio.check_on_air``), whatever the test itself checked."""
    mark = fake_radio.radios_built()
    yield
    fake_radio.check_radios_since(mark)


async def _sqlite_store(tmp: Path) -> MemoryStore:
    return await SqliteStore.open(tmp / "contract.db")


async def _postgres_store(tmp: Path) -> MemoryStore:
    return await pg_server.open_store()


# Every MemoryStore implementation, by name: a test that takes ``memory`` runs on each (the
# PostgreSQL run skipped, saying why, only when this machine cannot start a server).
STORES: dict[str, Callable[[Path], Awaitable[MemoryStore]]] = {
    "sqlite": _sqlite_store,
    "postgres": _postgres_store,
}


@pytest.fixture(params=sorted(STORES))
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    """An empty store, once per implementation (``STORES``)."""
    store = await STORES[request.param](tmp_path)
    yield store
    await store.close()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    server = FakeLLM()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def url() -> Iterator[str]:
    """A fresh database on the shared PostgreSQL server (tests/pg_server.py), dropped after
    the test; the URL names the bot's role (password: ``pg_server.BOT_PASSWORD``)."""
    server = pg_server.shared()
    name = server.new_database()
    yield server.url(name)
    server.drop_database(name)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(tmp_path / "state" / "meshsage.db")
    yield s
    await s.close()


def make_config(
    tmp_path: Path, base_url: str, extra: str = "", *, read_timeout: float = 30
) -> Config:
    """A config file on disk pointing at the fake LLM, loaded the way the CLI loads it.
    ``read_timeout`` is generous (a loaded machine is slow, and the fake answers at once); a
    test about a hung model passes its own, shorter one. ``connect_timeout`` (also the openai
    client's write and pool timeout) is 10 s for the same reason: 2 s timed out under load."""
    path = tmp_path / "config.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"llm:\n  base_url: {base_url}\n  model: fake\n  retries: 0\n"
        f"  read_timeout: {read_timeout}\n  connect_timeout: 10\n" + extra,
        encoding="utf-8",
    )
    return load_config(path, env={})


class Harness:
    """A running app wired with a FakeTransport and the fake LLM server."""

    def __init__(self, app: App, transport: FakeTransport, llm: FakeLLM) -> None:
        self.app = app
        self.transport = transport
        self.llm = llm

    async def say(self, text: str, **kw: Any) -> None:
        await self.transport.say(text, **kw)
        await self.app.responder.wait_idle()

    def transport_key(self, sender: str, space: str = DM_SPACE) -> ConversationKey:
        return ConversationKey(self.transport.name, sender, space)

    @property
    def store(self) -> SqliteStore:
        assert isinstance(self.app.store, SqliteStore)  # harnesses use the default store
        return self.app.store


async def start_harness(
    tmp_path: Path,
    llm: FakeLLM,
    *,
    extra: str = "",
    transport: FakeTransport | None = None,
    read_timeout: float = 30,
) -> Harness:
    transport = transport or FakeTransport()
    config = make_config(tmp_path, llm.base_url, extra, read_timeout=read_timeout)
    app = await build(config, env={}, transports=[transport])
    await app.start()
    return Harness(app, transport, llm)


@pytest.fixture
async def harness(tmp_path: Path, fake_llm: FakeLLM) -> AsyncIterator[Harness]:
    h = await start_harness(tmp_path, fake_llm)
    yield h
    await h.app.close()


@pytest.fixture
async def fake_discord(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    """The loopback Discord, running, with discord.py pointed at it (Discord tests only)."""
    from tests.fakes.fake_discord import FakeDiscord  # imports discord: only when asked for

    server = FakeDiscord()
    await server.start()
    server.patch(monkeypatch)
    yield server
    await server.stop()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``cli.main()`` called in-process configures logging (root handler, quieter library
    loggers); undo it so later tests (caplog) see the defaults."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    named = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in named.items():
        logging.getLogger(name).setLevel(lvl)
    for name in set(logging.root.manager.loggerDict) - set(named):
        logging.getLogger(name).setLevel(logging.NOTSET)
