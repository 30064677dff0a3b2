"""On a small disk the WAL must not dwarf the database (issue 28 point 5): an idle tick
truncates a WAL that outgrew half the database, and a restarted WAL is cut back to
``WAL_KEEP_BYTES`` (``journal_size_limit``). Before: 807 KB of WAL next to a 201 KB database
on a 1 MiB state dir (``wal_autocheckpoint = 0``, no size limit)."""

from __future__ import annotations

from pathlib import Path

from bot.domain import ConversationKey
from bot.memory.sqlite.base import WAL_KEEP_BYTES
from bot.memory.sqlite.upkeep import wal_limit
from bot.memory.store import USER, SqliteStore


async def test_idle_tick_keeps_the_wal_smaller_than_the_database(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "memory.db")
    try:
        limit = await (await store._db.execute("PRAGMA journal_size_limit")).fetchone()
        assert limit is not None and limit[0] == WAL_KEEP_BYTES
        conv = await store.conversation(ConversationKey("mesh", "!0000abcd"))
        for i in range(150):
            await store.add_message(conv.id, role=USER, author="a", text=f"note {i} " * 60,
                                    tokens=60, status="answered")  # fmt: skip
        wal = store.path.with_name(store.path.name + "-wal")
        grown = wal.stat().st_size
        assert grown > wal_limit(store.path.stat().st_size)  # the case being fixed
        await store.tidy()
        assert wal.stat().st_size <= wal_limit(store.path.stat().st_size)
        assert wal.stat().st_size < grown
    finally:
        await store.close()


def test_wal_limit_is_half_the_database_within_bounds() -> None:
    assert wal_limit(0) == 256 * 1024
    assert wal_limit(10 * 1024 * 1024) == 5 * 1024 * 1024
    assert wal_limit(10**12) == 64 * 1024 * 1024
