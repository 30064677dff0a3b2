"""SQLite-specific store behaviour on real files: migrations, WAL, foreign keys, FTS sync, bad
database files. Behaviour every store shares is in test_store_contract.py."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.errors import StorageError
from bot.memory.schema import MIGRATIONS, migrate
from bot.memory.store import SqliteStore
from tests.fakes.fake_llm import FakeLLM

KEY = ConversationKey("console", "alice")


async def test_blank_database_is_migrated_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "m.db"
    store = await SqliteStore.open(path)
    rows = await store._all("SELECT name FROM schema_migrations ORDER BY name")
    assert [r[0] for r in rows] == [name for name, _ in MIGRATIONS]
    assert (await store._all("PRAGMA journal_mode"))[0][0] == "wal"
    assert (await store._all("PRAGMA foreign_keys"))[0][0] == 1
    await store.close()
    again = await SqliteStore.open(path)  # reopening applies nothing twice
    assert len(await again._all("SELECT name FROM schema_migrations")) == len(MIGRATIONS)
    await again.close()


@pytest.mark.parametrize("applied", range(1, len(MIGRATIONS) + 1))
async def test_upgrade_from_each_earlier_schema(tmp_path: Path, applied: int) -> None:
    import aiosqlite

    path = tmp_path / "m.db"
    db = await aiosqlite.connect(path, isolation_level=None)
    await migrate(db, MIGRATIONS[:applied])
    # Rows written by that version (001's columns, which later migrations must keep).
    await db.execute(
        "INSERT INTO conversations (transport, person, space, created_at) "
        "VALUES ('console', 'alice', 'dm', 1000.0)"
    )
    await db.execute(
        "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens, status) "
        "VALUES (1, 'user', 'alice', 'my old kumquat note', 1000.0, 4, 'answered')"
    )
    await db.execute(
        "INSERT INTO facts (conversation_id, text, tokens, created_at) "
        "VALUES (1, 'likes kumquats', 2, 1000.0)"
    )
    await db.close()
    store = await SqliteStore.open(path)
    names = [r[0] for r in await store._all("SELECT name FROM schema_migrations ORDER BY name")]
    assert names == [n for n, _ in MIGRATIONS]
    conv = await store.conversation(KEY)
    assert conv.id == 1  # the old conversation, not a new one
    assert [m.text for m in await store.all_messages(conv.id)] == ["my old kumquat note"]
    assert [f.text for f in await store.facts(conv.id)] == ["likes kumquats"]
    await store.add_message(conv.id, role="user", author="a", text="new kumquat", tokens=1,
                            status="x")  # fmt: skip
    hits = await store._all("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'kumquat'")
    assert hits[0][0] == 2  # the index still covers the old row and the new one
    await store.close()


async def test_failed_migration_leaves_previous_version(tmp_path: Path) -> None:
    import aiosqlite

    db = await aiosqlite.connect(tmp_path / "m.db", isolation_level=None)
    broken = [*MIGRATIONS, ("999_broken", lambda: "CREATE TABLE t (x); CREATE TABLE t (y);")]
    with pytest.raises(sqlite3.OperationalError):
        await migrate(db, broken)
    tables = [r[0] for r in await db.execute_fetchall("SELECT name FROM sqlite_master")]
    assert "t" not in tables
    names = [r[0] for r in await db.execute_fetchall("SELECT name FROM schema_migrations")]
    assert "999_broken" not in names
    await db.close()


async def test_fts_follows_inserts_and_deletes(store: SqliteStore) -> None:
    conv = await store.conversation(KEY)
    mid = await store.add_message(
        conv.id, role="user", author="alice", text="Running shoes", tokens=2, status="x"
    )
    hits = await store.search_terms(conv.id, ["run"], after_id=0, before_id=10**9)
    assert hits == [[mid]]  # porter stemming: run ~ running
    await store.forget_person("console", "alice")
    n = await store._all("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'run'")
    assert n[0][0] == 0


async def test_corrupted_database_says_how_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StorageError) as err:
        await SqliteStore.open(path)
    assert "damaged" in str(err.value) and "move the file aside" in str(err.value)


async def test_read_only_database_says_how_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    await (await SqliteStore.open(path)).close()
    path.chmod(0o444)
    immutable = False
    if os.geteuid() == 0:  # root ignores permissions: make the file immutable instead
        immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
        if not immutable:
            pytest.skip("running as root without chattr: cannot make a read-only file")
    try:
        with pytest.raises(StorageError) as err:
            await SqliteStore.open(path)
        assert "read" in str(err.value) and "writable" in str(err.value)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)


async def test_unusable_state_directory_says_how_to_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError) as err:
        await SqliteStore.open(blocker / "sub" / "m.db")
    assert "MESHSAGE_STATE_DIR" in str(err.value)


async def test_retention_prunes_old_messages_and_their_index(store: SqliteStore) -> None:
    conv = await store.conversation(KEY)
    await store.add_message(
        conv.id,
        role="user",
        author="a",
        text="ancient kiwi",
        tokens=1,
        status="x",
        created_at=1000.0,
    )
    await store.add_message(
        conv.id, role="user", author="a", text="fresh kiwi", tokens=1, status="x"
    )
    assert await store.prune_older_than(2000.0, batch=1) == 1
    hits = await store.search_terms(conv.id, ["kiwi"], after_id=0, before_id=10**9)
    assert len(hits[0]) == 1


async def test_app_applies_retention_at_start(tmp_path: Path, fake_llm: FakeLLM) -> None:
    from tests.conftest import start_harness

    first = await start_harness(tmp_path, fake_llm)
    conv = await first.store.conversation(first.transport_key("alice"))
    await first.store.add_message(conv.id, role="user", author="a", text="very old", tokens=1,
                                  status="answered", created_at=1_000.0)  # fmt: skip
    await first.say("recent")
    await first.app.close()
    second = await start_harness(tmp_path, fake_llm, extra="memory:\n  retention_days: 30\n")
    try:
        for _ in range(200):
            if (await second.store.stats())["messages"] == 2:
                break
            await asyncio.sleep(0.01)
        texts = [m.text for m in await second.store.all_messages(conv.id)]
        assert texts == ["recent", "Hello from fake"]
    finally:
        await second.app.close()


async def test_tidy_checkpoints_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteStore.open(path)
    conv = await store.conversation(KEY)
    for i in range(300):
        await store.add_message(conv.id, role="user", author="a", text=f"filler text {i}" * 20,
                                tokens=1, status="x")  # fmt: skip
    main_before = path.stat().st_size
    assert path.with_name("m.db-wal").stat().st_size > 100_000  # no autocheckpoint: all in WAL
    await store.tidy()
    assert path.stat().st_size > main_before + 100_000  # the pages reached the main file
    await store.close()


async def test_a_commit_that_fails_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A COMMIT SQLite refuses ("SQL statements in progress": here a write's cursor left half
    read on the connection) fails that one write, rolled back; it must not leave the
    transaction open, or every later write fails ("cannot start a transaction within a
    transaction") until a restart. Seen once with ten people waiting during a !forget."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        with pytest.raises(sqlite3.OperationalError, match="statements in progress"):
            async with store._atomic() as tx:
                cur = await tx.db.execute(
                    "INSERT INTO link_codes (code_hash, transport, person, expires_at) "
                    "VALUES ('a', 'mesh', 'p', 1), ('b', 'mesh', 'p', 1) RETURNING code_hash"
                )
                assert await cur.fetchone() is not None  # the second row is never read
        await cur.close()
        assert not store._db.in_transaction
        assert await store._all("SELECT count(*) FROM link_codes") == [(0,)]  # rolled back
        async with store._atomic() as tx:  # the next write works
            await tx.exec("INSERT INTO link_codes VALUES ('c', 'mesh', 'p', 1)")
        assert await store._val("SELECT count(*) FROM link_codes") == 1
    finally:
        await store.close()
