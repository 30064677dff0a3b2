"""PostgreSQL's bad days (issue 19, "Bad input and edge cases"): a server restarting mid-turn,
a role that may not create tables at first start, a database of a newer meshsage. (An
interrupted ``migrate-store`` is in tests/test_migrate_store.py.)

The restart tests run their own server (tests/pg_server.py), stopped and started again as a
restart does, so the suite's shared server is never disturbed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.errors import StorageError
from bot.memory.sqlite import SqliteStore
from tests import pg_server

asyncpg = pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
from bot.memory.postgres import PostgresStore  # noqa: E402 (needs asyncpg, checked above)
from bot.memory.postgres import base as pg_base  # noqa: E402

ALICE = ConversationKey("mesh", "!0000abcd")


@pytest.fixture
async def own_server() -> AsyncIterator[pg_server.PgServer]:
    pg_server.shared()  # skips, saying why, where no server can run
    server = await asyncio.to_thread(pg_server.PgServer.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def _open(server: pg_server.PgServer) -> PostgresStore:
    url = server.url(await asyncio.to_thread(server.new_database))
    return await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)


async def _asked_then_halted(store: PostgresStore, server: pg_server.PgServer) -> tuple[int, int]:
    """A person's question stored (pending), then the server stopped as a restart stops it."""
    conv = await store.conversation(ALICE)
    q = await store.add_message(conv.id, role="user", author="alice", text="question",
                                tokens=1, status="pending")  # fmt: skip
    await asyncio.to_thread(server.halt)
    await asyncio.sleep(0.3)  # the pool notices its connections closed
    return conv.id, q


async def test_a_restart_mid_turn_is_waited_for(own_server: pg_server.PgServer) -> None:
    """The server goes down after a person's message was stored and comes back a second
    later: the turn's next writes wait for it instead of failing, and nothing is lost."""
    store = await _open(own_server)
    try:
        conv_id, q = await _asked_then_halted(store, own_server)

        async def back_soon() -> None:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(own_server.resume)

        restart = asyncio.create_task(back_soon())
        a = await store.add_message(conv_id, role="assistant", author="bot", text="answer",
                                    tokens=1, status="sent", parent_id=q)  # fmt: skip
        await restart
        assert await store.mark_answered(conv_id, [q]) == 1
        rows = await store.messages_between(conv_id, after_id=0, up_to_id=10**9)
        assert [(m.id, m.text, m.status) for m in rows] == [
            (q, "question", "answered"), (a, "answer", "sent")]  # fmt: skip
    finally:
        await store.close()


async def test_a_server_down_too_long_fails_clearly_and_loses_nothing(
    own_server: pg_server.PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_base, "RECONNECT_SECONDS", 0.5)
    store = await _open(own_server)
    try:
        conv_id, q = await _asked_then_halted(store, own_server)
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"cannot reach PostgreSQL .* Fix: check that the"):
            await store.add_message(conv_id, role="assistant", author="bot", text="answer",
                                    tokens=1, status="sent", parent_id=q)  # fmt: skip
        assert time.monotonic() - started >= 0.3  # it waited before giving up
        await asyncio.to_thread(own_server.resume)
        rows = await store.messages_between(conv_id, after_id=0, up_to_id=10**9)
        assert [(m.id, m.status) for m in rows] == [(q, "pending")]  # still to be answered
    finally:
        await store.close()


async def test_first_start_without_create_rights_names_the_grant() -> None:
    server = pg_server.shared()
    name = f"nocreate{os.getpid()}_{int(time.time() * 1000) % 100000}"
    server.psql(f"CREATE DATABASE {name};\nGRANT CONNECT ON DATABASE {name} TO meshsage;\n")
    try:
        with pytest.raises(StorageError) as caught:
            await PostgresStore.open(server.url(name), password=pg_server.BOT_PASSWORD)
        text = str(caught.value)
        assert "lacks a privilege" in text and "pg-secret" not in text
        assert "GRANT USAGE, CREATE ON SCHEMA public TO meshsage;" in text
    finally:
        server.drop_database(name)


async def test_a_postgresql_database_of_a_newer_version_is_refused_untouched() -> None:
    store = await pg_server.open_store()
    url = store.url
    await store._exec("INSERT INTO schema_migrations (name) VALUES ('999_from_the_future')")
    await store.close()
    with pytest.raises(StorageError, match=r"newer meshsage .*999_from_the_future.* Fix: run"):
        await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)


async def test_a_sqlite_file_of_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteStore.open(path)
    await store._db.execute("INSERT INTO schema_migrations (name) VALUES ('999_from_the_future')")
    await store.close()
    before = path.read_bytes()
    with pytest.raises(StorageError, match=r"newer meshsage .*999_from_the_future"):
        await SqliteStore.open(path)
    assert not list(tmp_path.glob("*.bak*")) and not list(tmp_path.glob("*before*"))
    assert path.read_bytes() == before
