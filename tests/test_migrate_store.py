"""``meshsage migrate-store``: SQLite -> PostgreSQL -> SQLite copies every row with its id, the
search index and vectors work in the copy, counts are verified, and a non-empty destination is
refused."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bot.domain import ConversationKey
from bot.errors import StorageError
from bot.memory.move import DERIVED, ORDER, Progress, copy_store
from bot.memory.open import open_url
from bot.memory.records import OutboxEntry
from bot.memory.sqlite import SqliteStore
from tests import pg_server

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")

ALICE = ConversationKey("mesh", "!0000abcd")
BOB = ConversationKey("discord", "42", "guild-1")


async def _fill(store: SqliteStore) -> None:
    a = await store.conversation(ALICE)
    q = await store.add_message(a.id, role="user", author="alice", text="my kayak is Bluebird",
                                tokens=5, status="answered", platform_id="p1")  # fmt: skip
    r = await store.add_message(a.id, role="assistant", author="bot", text="Nice kayak!",
                                tokens=3, status="delivered", parent_id=q)  # fmt: skip
    await store.reset(a.id)
    await store.add_message(a.id, role="user", author="alice", text="après reset", tokens=2,
                            status="pending", reply_to_platform_id="p1")  # fmt: skip
    await store.save_summary(a.id, text="kayak talk", first_message_id=r + 1,
                             last_message_id=r + 1, tokens=2)  # fmt: skip
    await store.add_fact(a.id, text="owns a kayak", tokens=3)
    b = await store.conversation(BOB)
    await store.add_messages(b.id, [("user", "bob", f"line {i} about ropes", 4, 1e9 + i)
                                    for i in range(30)])  # fmt: skip
    await store.add_vectors([(q, a.id, "m", [0.6, 0.8]), (r, a.id, "m", [1.0, 0.0])])
    oid = await store.queue_delivery(OutboxEntry(ALICE, "answer", "Nice", question_id=q, rest="!"))
    await store.record_part(oid, 0, "pkt-9")
    await store.add_session(a.id, first_message_id=q, last_message_id=r, started_at=1e9,
                            ended_at=1e9 + 60, messages=2)  # fmt: skip
    await store.save_longterm_summary(a.id, text="kayaks", tokens=1, sessions=1,
                                      up_to_message_id=r)  # fmt: skip
    # A DM linked into an older conversation: its home is a later row (written after all rows).
    await store.link_dm(ConversationKey("discord", "77"), ConversationKey("mesh", "!00000077"))


async def _dump(store: SqliteStore | PostgresStore) -> dict[str, list[tuple[object, ...]]]:
    """Every copied table's rows, in the source's column order minus derived columns."""
    out = {}
    for table, key in ORDER:
        cols = tuple(c for c in await store.table_columns(table) if c not in DERIVED)
        if cols:
            out[table] = await store.export_rows(table, key, cols, after=-1, limit=10**6)
    return out


async def test_round_trip_sqlite_postgres_sqlite(tmp_path: Path, url: str) -> None:
    env = {"PW": pg_server.BOT_PASSWORD}
    first = await SqliteStore.open(tmp_path / "a.db")
    await _fill(first)
    pg = await open_url(url, password_env="PW", env=env)
    back = await SqliteStore.open(tmp_path / "b.db")
    seen: list[tuple[str, int, int]] = []
    try:
        counts = await copy_store(first, pg, progress=lambda t, d, n: seen.append((t, d, n)))
        assert {t: n for t, n in counts.items() if n} == {
            "conversations": 4, "messages": 33, "summaries": 1, "facts": 1,
            "message_vectors": 2, "outbox": 1, "outbox_parts": 1, "sessions": 1,
            "longterm_summaries": 1,
        }  # fmt: skip
        assert seen[-1][1:] == (45, 45)
        analyzed = await pg._all(  # the copy is analyzed and vacuumed at once, not some day
            "SELECT relname FROM pg_stat_user_tables WHERE last_analyze IS NOT NULL "
            "AND last_vacuum IS NOT NULL AND relname IN ('messages', 'message_words')"
        )
        assert len(analyzed) == 2
        await copy_store(pg, back, progress=lambda *_: None)
        original, there, again = await _dump(first), await _dump(pg), await _dump(back)
        assert there == original and again == original
        for store in (pg, back):  # the copies index and search like the original
            a = await store.conversation(ALICE)
            assert a.reset_after == 2
            assert await store.search_terms(a.id, ["kayak", "apres"], after_id=0,
                                            before_id=10**9) == [[1, 2], [3]]  # fmt: skip
            hits = await store.vector_search(a.id, [0.6, 0.8], model="m", after_id=0,
                                             before_id=10**9, limit=1)  # fmt: skip
            assert hits[0][0] == 1
            new = await store.add_message(a.id, role="user", author="alice", text="new",
                                          tokens=1, status="pending")  # fmt: skip
            assert new == 34  # ids continue after the copied ones
        with pytest.raises(StorageError, match="already holds conversations"):
            await copy_store(first, pg, progress=lambda *_: None)
    finally:
        for s in (first, pg, back):
            await s.close()


async def test_cli_copies_with_a_progress_bar(tmp_path: Path, url: str) -> None:
    src = await SqliteStore.open(tmp_path / "a.db")
    await _fill(src)
    await src.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env["MESHSAGE_PG_PASSWORD"] = pg_server.BOT_PASSWORD
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "migrate-store",
        "--from", f"sqlite://{tmp_path / 'a.db'}", "--to", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 0, text
    assert "100.0% 45/45" in text
    assert "copied and verified 4 conversations, 33 messages" in text


class _Interrupted(Exception):
    pass


def _stop_after(batches: int) -> Progress:
    seen = [0]

    def progress(table: str, done: int, total: int) -> None:
        seen[0] += 1
        if seen[0] > batches:
            raise _Interrupted(table)

    return progress


@pytest.mark.parametrize("into", ["postgresql", "sqlite"])
async def test_an_interrupted_copy_is_refused_until_a_rerun_starts_over(
    tmp_path: Path, url: str, into: str
) -> None:
    """A copy that stops half way leaves a destination nothing but migrate-store will open;
    running it again empties it and copies everything, verified."""
    source = await SqliteStore.open(tmp_path / "a.db")
    await _fill(source)
    b = await source.conversation(BOB)
    await source.add_messages(b.id, [("user", "bob", f"more {i}", 2, 2e9 + i)
                                     for i in range(5000)])  # fmt: skip
    env = {"PW": pg_server.BOT_PASSWORD}
    dest_url = url if into == "postgresql" else f"sqlite://{tmp_path / 'b.db'}"
    try:
        dest = await open_url(dest_url, password_env="PW", env=env, copying=True)
        try:
            with pytest.raises(_Interrupted):
                await copy_store(source, dest, progress=_stop_after(2))
            assert 0 < await dest.count_rows("messages") < 5033
        finally:
            await dest.close()
        with pytest.raises(StorageError, match="unfinished `meshsage migrate-store` copy"):
            await open_url(dest_url, password_env="PW", env=env)  # what the bot would do
        dest = await open_url(dest_url, password_env="PW", env=env, copying=True)
        try:
            counts = await copy_store(source, dest, progress=lambda *_: None)
            assert counts["messages"] == 5033
        finally:
            await dest.close()
        dest = await open_url(dest_url, password_env="PW", env=env)  # now a store like any
        try:
            assert await _dump(dest) == await _dump(source)
            with pytest.raises(StorageError, match="already holds conversations"):
                await copy_store(source, dest, progress=lambda *_: None)
        finally:
            await dest.close()
    finally:
        await source.close()


async def test_cli_killed_mid_copy_then_run_again(tmp_path: Path, url: str) -> None:
    """The real command, killed (SIGKILL) while it copies messages into PostgreSQL: the bot's
    own open refuses the half copy, and the same command run again completes it."""
    src = await SqliteStore.open(tmp_path / "a.db")
    await _fill(src)
    b = await src.conversation(BOB)
    for n in range(4):
        await src.add_messages(b.id, [("user", "bob", f"batch {n} line {i} about knots", 5,
                                       3e9 + n * 10_000 + i) for i in range(10_000)])  # fmt: skip
    await src.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env["MESHSAGE_PG_PASSWORD"] = pg_server.BOT_PASSWORD
    argv = [sys.executable, "-m", "bot.cli", "migrate-store",
            "--from", f"sqlite://{tmp_path / 'a.db'}", "--to", url]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stderr is not None
    seen = b""
    while b" messages" not in seen.split(b"\r")[-1]:  # some messages copied, not all
        chunk = await asyncio.wait_for(proc.stderr.read(200), 120)
        assert chunk, seen.decode()
        seen += chunk
    proc.kill()
    await proc.wait()
    assert b"100.0%" not in seen
    with pytest.raises(StorageError, match="unfinished `meshsage migrate-store` copy"):
        await open_url(url, password_env="PW", env={"PW": pg_server.BOT_PASSWORD})
    again = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE, env=env)
    _, err = await asyncio.wait_for(again.communicate(), 300)
    assert again.returncode == 0, err.decode()
    assert "copied and verified 4 conversations, 40,033 messages" in err.decode()
    pg = await open_url(url, password_env="PW", env={"PW": pg_server.BOT_PASSWORD})
    try:
        assert await pg.count_rows("messages") == 40_033
    finally:
        await pg.close()
