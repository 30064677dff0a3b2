"""SQLite's part of deleting and upkeep (the rest is ``bot.memory.core.upkeep``): the erase
after ``!forget``, WAL checkpoints and FTS merges, the end of a row copy.

Invariants:
- After ``forget_person`` no text of the person stays in the database files: the FTS delete
  trigger removes the index entries, the index is then rewritten so no segment keeps their
  words, the WAL is checkpointed, and ``secure_delete`` overwrites the freed pages.
- The erase is crash-safe: the delete and a ``scrub_pending`` mark commit together; the mark is
  cleared only after the index rewrite and the WAL truncation, and an open store finishes a
  marked scrub first (``finish_scrub``).
"""

from __future__ import annotations

import time

from bot.memory.core.db import Tx
from bot.memory.sqlite.base import SqliteBase

WAL_FORCE_BYTES = 64 * 1024 * 1024
WAL_FLOOR_BYTES = 256 * 1024
FTS_MERGE_PAGES = 64  # a bounded slice of merge work per checkpoint
# A checkpoint waits for this many changed rows (about 80 turns), this long a quiet spell, or
# a WAL past wal_limit (a small database: every few turns).
CHECKPOINT_CHANGES = 2000
QUIET_SECONDS = 900.0


class SqliteUpkeepMixin(SqliteBase):
    async def _mark_erase(self, tx: Tx) -> None:
        await tx.exec(
            "INSERT OR REPLACE INTO scrub_pending (id, since) VALUES (1, ?)", (time.time(),)
        )

    async def _erase(self) -> None:
        await self.finish_scrub()

    async def finish_scrub(self) -> bool:
        """Finish an erase a crash interrupted (called at open); True if there was one."""
        row = await self._one("SELECT since FROM scrub_pending WHERE id = 1")
        if row is None:
            return False
        await self._erase_deleted()
        await self._exec("DELETE FROM scrub_pending WHERE id = 1")
        async with self._lock:
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return True

    async def _erase_deleted(self) -> None:
        """Make deletions physical, not just invisible. FTS5 records a delete as a marker and
        keeps the words in older index segments until they are merged, and WAL frames keep
        old page images until a checkpoint; ``secure_delete`` only zeroes freed pages. So
        rewrite the index (seconds on a million messages; ``!forget`` is rare) and checkpoint.
        """
        async with self._lock:
            await self._db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # --- operations -------------------------------------------------------------------------
    async def tidy(self) -> None:
        """Upkeep for idle moments, only when there is something to do: a little FTS5 merge
        work and a WAL checkpoint once ``CHECKPOINT_CHANGES`` rows changed since the last one
        or the store has been quiet for ``QUIET_SECONDS`` after a change; the WAL truncated
        once it outgrows ``wal_limit``. A checkpoint copies each page the WAL holds to the
        database once, however many commits rewrote it: checkpointing after every turn wrote
        the same leaf pages again each turn (about a quarter of a turn's bytes)."""
        now = time.monotonic()
        changes = self._db.total_changes
        if changes != self._tidy_changes:
            self._tidy_changes, self._changed_at = changes, now
        pending = changes - self._checkpointed_changes
        if pending <= 0:
            return  # nothing written since the last checkpoint: an idle bot writes nothing
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            oversized = wal.stat().st_size > wal_limit(self.path.stat().st_size)
        except OSError:
            oversized = False
        quiet = now - self._changed_at >= QUIET_SECONDS
        if not (oversized or quiet or pending >= CHECKPOINT_CHANGES):
            return
        async with self._lock:
            await self._db.execute(
                "INSERT INTO messages_fts (messages_fts, rank) VALUES ('merge', ?)",
                (FTS_MERGE_PAGES,),
            )
            mode = "TRUNCATE" if oversized else "PASSIVE"
            await self._db.execute(f"PRAGMA wal_checkpoint({mode})")
            self._checkpointed_changes = self._tidy_changes = self._db.total_changes

    # --- moving (bot.memory.move) -----------------------------------------------------------
    async def table_columns(self, table: str) -> list[str]:
        """Column names of ``table`` in order; empty if there is no such table."""
        rows = await self._all(f"PRAGMA table_info({table})")
        return [str(r[1]) for r in rows]

    async def finish_import(self) -> None:
        async with self._lock:
            await self._db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def wal_limit(database_bytes: int) -> int:
    """WAL size past which an idle tick truncates it: half the database, at least
    ``WAL_FLOOR_BYTES``, at most ``WAL_FORCE_BYTES`` (the WAL never dwarfs the database)."""
    return min(WAL_FORCE_BYTES, max(WAL_FLOOR_BYTES, database_bytes // 2))
