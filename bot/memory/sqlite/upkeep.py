"""Deleting and upkeep: ``!forget``, retention, WAL checkpoints and FTS merges, counts.

Invariants:
- ``forget_person`` deletes every row about a person: conversations cascade to messages,
  summaries and facts, messages cascade to their vectors; the FTS delete trigger removes the
  index entries, the index is then rewritten so no segment keeps their words, the WAL is
  checkpointed, and ``secure_delete`` overwrites the freed pages: none of their text stays in
  the database files.
- The erase is crash-safe: the delete and a ``scrub_pending`` mark commit together; the mark is
  cleared only after the index rewrite and the WAL truncation, and an open store finishes a
  marked scrub first (``finish_scrub``). A repeated ``!forget`` always scrubs, even when
  nothing is left to delete. The person's outbox rows go too, and on one side of a link
  what the other side derived from this side's words (``bot.memory.keep``).
- Retention and forgetting by use also prune finished outbox rows past their short keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from bot.memory.core.db import SQLITE
from bot.memory.core.identity import give_back
from bot.memory.keep import facts_touching, outbox_cutoff
from bot.memory.records import ForgetReport
from bot.memory.sqlite.base import SqliteBase, SqliteTx

WAL_FORCE_BYTES = 64 * 1024 * 1024
FTS_MERGE_PAGES = 64  # a bounded slice of merge work per idle tick


class UpkeepMixin(SqliteBase):
    async def forget_person(self, transport: str, person: str) -> ForgetReport:
        """Delete every row about ``person`` on ``transport``: all spaces, index rows included."""
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT id FROM conversations WHERE transport = ? AND person = ?",
                (transport, person),
            )
            ids = [r[0] for r in await cur.fetchall()]
            counts = [0, 0, 0]
            if ids:
                marks = ",".join("?" * len(ids))
                # Linked DMs first go back apart: what came from the other side stays theirs,
                # what came from this person's side comes home to be deleted.
                cur = await db.execute(
                    f"SELECT id FROM conversations WHERE id IN ({marks}) AND merged_into IS NOT "
                    f"NULL UNION SELECT id FROM conversations WHERE merged_into IN ({marks})",
                    [*ids, *ids],
                )
                absorbed_ids = [int(r[0]) for r in await cur.fetchall()]
                partners = await _partners(db, ids, absorbed_ids)
                cur = await db.execute(  # this person's words, wherever a link put them
                    "SELECT id FROM messages WHERE coalesce(origin_conversation_id, "
                    f"conversation_id) IN ({marks})",
                    ids,
                )
                theirs = {int(r[0]) for r in await cur.fetchall()}
                for absorbed in absorbed_ids:
                    await give_back(SqliteTx(db), SQLITE, absorbed)
                await _clear_partners(db, partners, theirs)
                self._vectors.drop([p for p, _, _ in partners])
                for i, table in enumerate(("messages", "summaries", "facts")):
                    cur = await db.execute(
                        f"SELECT count(*) FROM {table} WHERE conversation_id IN ({marks})", ids
                    )
                    row = await cur.fetchone()
                    counts[i] = int(row[0]) if row else 0
                # Messages go first, explicitly, so the FTS delete trigger sees each row
                # (and the vectors cascade with them).
                await db.execute(f"DELETE FROM messages WHERE conversation_id IN ({marks})", ids)
                await db.execute(f"DELETE FROM conversations WHERE id IN ({marks})", ids)
                self._vectors.drop(ids)
            await db.execute(
                "DELETE FROM outbox WHERE transport = ? AND person = ?", (transport, person)
            )
            await db.execute(
                "INSERT OR REPLACE INTO scrub_pending (id, since) VALUES (1, ?)", (time.time(),)
            )
        await self.finish_scrub()
        return ForgetReport(len(ids), *counts)

    async def finish_scrub(self) -> bool:
        """Finish an erase a crash interrupted (called at open); True if there was one."""
        row = await self._one("SELECT since FROM scrub_pending WHERE id = 1")
        if row is None:
            return False
        await self._erase_deleted()
        async with self._tx() as db:
            await db.execute("DELETE FROM scrub_pending WHERE id = 1")
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
        """Upkeep for idle moments: checkpoint the WAL, do a little FTS5 merge work."""
        async with self._lock:
            await self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            await self._db.execute(
                "INSERT INTO messages_fts (messages_fts, rank) VALUES ('merge', ?)",
                (FTS_MERGE_PAGES,),
            )
            wal = self.path.with_name(self.path.name + "-wal")
            with contextlib.suppress(OSError):
                if wal.stat().st_size > WAL_FORCE_BYTES:
                    await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # --- moving (bot.memory.move) -----------------------------------------------------------
    async def table_columns(self, table: str) -> list[str]:
        """Column names of ``table`` in order; empty if there is no such table."""
        rows = await self._all(f"PRAGMA table_info({table})")
        return [str(r[1]) for r in rows]

    async def update_rows(
        self, table: str, key: str, column: str, rows: list[tuple[Any, Any]]
    ) -> None:
        """Set ``column`` from (key, value) pairs (references written after every row)."""
        async with self._tx() as db:
            await db.executemany(
                f"UPDATE {table} SET {column} = ? WHERE {key} = ?", [(v, k) for k, v in rows]
            )

    async def count_rows(self, table: str) -> int:
        row = await self._one(f"SELECT count(*) FROM {table}")
        return int(row[0]) if row else 0

    async def export_rows(
        self, table: str, key: str, columns: tuple[str, ...], *, after: int, limit: int
    ) -> list[tuple[Any, ...]]:
        rows = await self._all(
            f"SELECT {', '.join(columns)} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT ?",
            (after, limit),
        )
        return [tuple(r) for r in rows]

    async def import_rows(
        self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None:
        """Insert rows with their ids (the FTS triggers index messages as they arrive)."""
        marks = ", ".join("?" * len(columns))
        async with self._tx() as db:
            await db.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows
            )

    async def finish_import(self) -> None:
        async with self._lock:
            await self._db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def messages_since(self, since: float) -> dict[str, int]:
        """Messages per role created at or after ``since`` (the status file's daily counts)."""
        rows = await self._all(
            "SELECT role, count(*) FROM messages WHERE created_at >= ? GROUP BY role", (since,)
        )
        return {str(r[0]): int(r[1]) for r in rows}

    async def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in ("conversations", "messages", "summaries", "facts"):
            row = await self._one(f"SELECT count(*) FROM {table}")
            out[table] = int(row[0]) if row else 0
        return out

    # --- forgetting by use --------------------------------------------------------------------
    async def note_retrieved(self, message_ids: Sequence[int]) -> None:
        """Count a use of each message that retrieval put into a prompt."""
        if not message_ids:
            return
        marks = ",".join("?" * len(message_ids))
        async with self._tx() as db:
            await db.execute(
                f"UPDATE messages SET uses = uses + 1 WHERE id IN ({marks})", list(message_ids)
            )

    async def mark_important(self, conversation_id: int, message_ids: Sequence[int]) -> int:
        """``!pin``: these messages are never pruned by use."""
        if not message_ids:
            return 0
        marks = ",".join("?" * len(message_ids))
        async with self._tx() as db:
            cur = await db.execute(
                f"UPDATE messages SET important = 1 WHERE conversation_id = ? AND id IN ({marks})",
                [conversation_id, *message_ids],
            )
            return cur.rowcount

    async def prune_by_use(self, max_per_conversation: int, *, batch: int = 500) -> int:
        """Keep at most ``max_per_conversation`` messages in each conversation: delete the
        least retrieved, oldest first; never important ones, nor the sources of pinned facts,
        nor messages still waiting for an answer. Summaries and sessions stay. Finished outbox
        rows past their short keep go too (bot.memory.keep)."""
        await self.prune_outbox(outbox_cutoff(time.time()), batch=batch)
        total = 0
        rows = await self._all(
            "SELECT conversation_id, count(*) - ? FROM messages GROUP BY conversation_id "
            "HAVING count(*) > ?",
            (max_per_conversation, max_per_conversation),
        )
        for conversation_id, excess in rows:
            while excess > 0:
                async with self._tx() as db:
                    cur = await db.execute(
                        "DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                        "WHERE conversation_id = ? AND important = 0 "
                        "AND status NOT IN ('pending', 'sending') AND id NOT IN "
                        "(SELECT j.value FROM facts f, json_each(f.source_ids) j "
                        " WHERE f.conversation_id = ? AND f.pinned = 1) "
                        "ORDER BY uses, id LIMIT ?)",
                        (conversation_id, conversation_id, min(excess, batch)),
                    )
                    n = cur.rowcount
                    if n:
                        self._vectors.drop([conversation_id])
                total += n
                excess -= n
                if n == 0:
                    break  # what is left is all kept on purpose
                await asyncio.sleep(0)
        return total

    async def prune_outbox(self, before: float, *, batch: int = 500) -> int:
        """Delete finished outbox rows last touched before ``before`` (their parts cascade),
        in small batches; pending rows stay (bot.memory.keep)."""
        total = 0
        while True:
            async with self._tx() as db:
                cur = await db.execute(
                    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox "
                    "WHERE state != 'pending' AND updated_at < ? ORDER BY updated_at LIMIT ?)",
                    (before, batch),
                )
                n = cur.rowcount
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int:
        """Retention: delete messages created before ``cutoff`` in small batches (no long lock),
        and finished outbox rows (the answers' text) past their short keep."""
        await self.prune_outbox(outbox_cutoff(time.time()), batch=batch)
        total = 0
        while True:
            async with self._tx() as db:
                cur = await db.execute(
                    "DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                    "WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                    (cutoff, batch),
                )
                n = cur.rowcount
                if n:
                    self._vectors.clear()  # pruned messages took their vectors with them
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)


async def _partners(db: Any, ids: list[int], absorbed: list[int]) -> list[tuple[int, str, str]]:
    """The other sides (id, transport, person) of the links ``ids`` take part in."""
    linked = set(absorbed)
    if ids:
        marks = ",".join("?" * len(ids))
        cur = await db.execute(
            f"SELECT merged_into FROM conversations WHERE id IN ({marks}) "
            "AND merged_into IS NOT NULL",
            ids,
        )
        linked |= {int(r[0]) for r in await cur.fetchall()}
    out = []
    for other in sorted(linked - set(ids)):
        cur = await db.execute("SELECT transport, person FROM conversations WHERE id = ?",
                               (other,))  # fmt: skip
        row = await cur.fetchone()
        if row is not None:
            out.append((other, str(row[0]), str(row[1])))
    return out


async def _clear_partners(db: Any, partners: list[tuple[int, str, str]], theirs: set[int]) -> None:
    """What the other side of a link derived from the forgotten side's words (bot.memory.keep)."""
    for other, transport, person in partners:
        await db.execute("DELETE FROM summaries WHERE conversation_id = ?", (other,))
        await db.execute("DELETE FROM longterm_summaries WHERE conversation_id = ?", (other,))
        await db.execute(
            "UPDATE sessions SET title = NULL, summary = NULL, tokens = 0 "
            "WHERE conversation_id = ?",
            (other,),
        )
        cur = await db.execute(
            "SELECT id, source_ids FROM facts WHERE conversation_id = ?", (other,)
        )
        gone = facts_touching([(r[0], r[1]) for r in await cur.fetchall()], theirs)
        if gone:
            await db.execute(f"DELETE FROM facts WHERE id IN ({','.join('?' * len(gone))})", gone)
        await db.execute(
            "DELETE FROM outbox WHERE transport = ? AND person = ?", (transport, person)
        )
