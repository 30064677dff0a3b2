"""Deleting and upkeep on PostgreSQL: ``!forget``, retention, counts.

Invariants:
- ``forget_person`` deletes every row about a person in one transaction: conversations
  cascade to messages (and with them their search words, which live in the row, and their
  vectors), summaries, facts and ``heard`` claims; the GIN index entries go with the rows.
  ``VACUUM`` then removes the dead row versions and their index entries at once, so nothing
  can read them back. PostgreSQL does not zero the space it frees (SQLite's
  ``secure_delete`` does): the bytes stay in free space and in the WAL until overwritten,
  which README "More than one gateway" says, with ``VACUUM FULL`` for a physical purge.
"""

from __future__ import annotations

import asyncio

from bot.memory.postgres.base import Conn, PgBase
from bot.memory.records import ForgetReport


class UpkeepMixin(PgBase):
    async def forget_person(self, transport: str, person: str) -> ForgetReport:
        """Delete every row about ``person`` on ``transport``: all spaces, index rows included."""
        async with self._tx() as con:
            ids = [
                int(r[0])
                for r in await con.fetch(
                    "SELECT id FROM conversations WHERE transport = $1 AND person = $2 FOR UPDATE",
                    transport,
                    person,
                )
            ]
            counts = [0, 0, 0]
            if ids:
                for i, table in enumerate(("messages", "summaries", "facts")):
                    counts[i] = int(
                        await con.fetchval(
                            f"SELECT count(*) FROM {table} WHERE conversation_id = ANY($1)", ids
                        )
                    )
                await con.execute("DELETE FROM conversations WHERE id = ANY($1)", ids)
        self._vectors.drop(ids)
        if ids:
            await self._vacuum()
        return ForgetReport(len(ids), *counts)

    async def _vacuum(self) -> None:
        """Make deletions physical: VACUUM frees the dead row versions and their index entries.
        Only the tables' owner may vacuum them; the bot's role is, since it created them."""

        async def work(con: Conn) -> None:
            for table in ("messages", "message_vectors", "summaries", "facts", "heard"):
                self.last_erase = await con.execute(f"VACUUM {table}")

        await self._run(work)

    # --- operations -------------------------------------------------------------------------
    async def tidy(self) -> None:
        """Upkeep for idle moments: PostgreSQL's autovacuum does it; nothing to do here."""

    async def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in ("conversations", "messages", "summaries", "facts"):
            out[table] = int(await self._val(f"SELECT count(*) FROM {table}") or 0)
        return out

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int:
        """Retention: delete messages created before ``cutoff`` in small batches (no long lock)."""
        total = 0
        while True:
            n = int(
                await self._val(
                    "WITH gone AS (DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                    "WHERE created_at < $1 ORDER BY created_at LIMIT $2 "
                    "FOR UPDATE SKIP LOCKED) RETURNING conversation_id) "
                    "SELECT count(*) FROM gone",
                    (cutoff, batch),
                )
                or 0
            )
            if n:
                self._vectors.clear()
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)
