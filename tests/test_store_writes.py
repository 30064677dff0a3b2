"""Few writes on an SD card (issue 43): a new database uses small pages, and upkeep writes
only when it has something to do (a checkpoint copies each page once, however many commits
rewrote it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.memory.sqlite import upkeep
from bot.memory.sqlite.base import PAGE_SIZE
from bot.memory.store import USER, SqliteStore

KEY = ConversationKey("mesh", "!0000abcd")


def _page_size(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA page_size").fetchone()[0])


async def test_a_new_database_gets_small_pages_and_an_old_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    new = tmp_path / "new.db"
    store = await SqliteStore.open(new)
    await store.close()
    assert PAGE_SIZE == 1024 and _page_size(new) == PAGE_SIZE
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:  # a database made by an earlier version: 4 KiB pages
        db.execute("PRAGMA page_size = 4096")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE t (x)")
    store = await SqliteStore.open(old)
    try:
        conv = await store.conversation(KEY)
        await store.add_message(conv.id, role=USER, author="a", text="still works", tokens=2,
                                status="answered")  # fmt: skip
        assert [m.text for m in await store.all_messages(conv.id)] == ["still works"]
    finally:
        await store.close()
    assert _page_size(old) == 4096


def _files(store: SqliteStore) -> tuple[int, int, int, int]:
    wal = store.path.with_name(store.path.name + "-wal")
    return (store.path.stat().st_size, store.path.stat().st_mtime_ns,
            wal.stat().st_size, wal.stat().st_mtime_ns)  # fmt: skip


async def test_upkeep_checkpoints_after_a_quiet_spell_and_then_writes_nothing(
    tmp_path: Path,
) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        conv = await store.conversation(KEY)
        for i in range(3):  # a few turns: far from every checkpoint threshold
            await store.add_message(conv.id, role=USER, author="a", text=f"turn {i}",
                                    tokens=2, status="answered")  # fmt: skip
        await store.tidy()
        main_size = store.path.stat().st_size
        await store.tidy()
        assert store.path.stat().st_size == main_size  # not copied yet: more turns may come
        store._changed_at -= upkeep.QUIET_SECONDS  # the person went quiet
        await store.tidy()
        assert store.path.stat().st_size > main_size  # the pages reached the database
        before = _files(store)
        for _ in range(5):  # an idle bot: nothing to do, nothing written
            await store.tidy()
        assert _files(store) == before
    finally:
        await store.close()


async def test_a_busy_store_still_checkpoints_by_the_number_of_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep, "wal_limit", lambda _size: 1 << 40)  # a large database
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        conv = await store.conversation(KEY)
        main_size = store.path.stat().st_size
        for i in range(upkeep.CHECKPOINT_CHANGES // 4):  # each adds a row and its index rows
            await store.add_message(conv.id, role=USER, author="a", text=f"x{i}", tokens=1,
                                    status="answered")  # fmt: skip
            if i % 50 == 0:
                await store.tidy()
                if store._db.total_changes < upkeep.CHECKPOINT_CHANGES:
                    assert store._checkpointed_changes == 0  # never idle, not enough yet
        await store.tidy()
        assert store._db.total_changes >= upkeep.CHECKPOINT_CHANGES
        assert store.path.stat().st_size > main_size
        assert store._checkpointed_changes == store._db.total_changes
    finally:
        await store.close()


async def test_clearing_a_recall_note_that_is_not_there_writes_nothing(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        conv = await store.conversation(KEY)
        mid = await store.add_message(conv.id, role=USER, author="a", text="hello", tokens=1,
                                      status="answered")  # fmt: skip
        wal = store.path.with_name(store.path.name + "-wal")
        changes, wal_size = store._db.total_changes, wal.stat().st_size
        await store.save_recall_note(mid, "")  # every turn without a note says this
        assert (store._db.total_changes, wal.stat().st_size) == (changes, wal_size)
        await store.save_recall_note(mid, "Earlier: the dog is Biscuit.", [mid])
        assert await store.recall_notes([mid]) == {mid: "Earlier: the dog is Biscuit."}
        await store.save_recall_note(mid, "")  # a retried turn clears the old note
        assert await store.recall_notes([mid]) == {}
    finally:
        await store.close()
