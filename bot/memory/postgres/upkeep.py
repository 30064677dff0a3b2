"""PostgreSQL's part of deleting and upkeep (the rest is ``bot.memory.core.upkeep``): the
VACUUM after ``!forget``, the end of a row copy, the watchdog's ping.

Invariants:
- After ``forget_person`` commits, ``VACUUM`` removes the dead row versions and their index
  entries at once, so nothing can read them back. PostgreSQL does not zero the space it frees
  (SQLite's ``secure_delete`` does): the bytes stay in free space and in the WAL until
  overwritten, which docs/postgresql.md says, with ``VACUUM FULL`` for a physical purge.
"""

from __future__ import annotations

from bot.memory.core.db import Tx
from bot.memory.postgres.base import Conn, PgBase, advance_sequences


class PgUpkeepMixin(PgBase):
    async def _mark_erase(self, tx: Tx) -> None:
        """Nothing: the VACUUM after the commit needs no mark (a crash before it leaves the
        dead rows to autovacuum)."""

    async def _erase(self) -> None:
        await self._vacuum()

    async def _vacuum(self) -> None:
        """Make deletions physical: VACUUM frees the dead row versions and their index entries.
        Only the tables' owner may vacuum them; the bot's role is, since it created them."""

        async def work(con: Conn) -> None:
            for table in (
                "messages", "message_words", "message_vectors", "summaries", "facts", "heard",
                "outbox", "outbox_parts", "outbox_packets", "sessions", "longterm_summaries",
            ):  # fmt: skip
                self.last_erase = await con.execute(f"VACUUM {table}")

        await self._run(work)

    # --- operations -------------------------------------------------------------------------
    async def tidy(self) -> None:
        """Upkeep for idle moments: PostgreSQL's autovacuum does it; nothing to do here."""

    # --- moving (bot.memory.move) -----------------------------------------------------------
    async def table_columns(self, table: str) -> list[str]:
        """Column names of ``table`` in order; empty if there is no such table."""
        rows = await self._all(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1 "
            "AND table_schema = current_schema() ORDER BY ordinal_position",
            (table,),
        )
        return [str(r[0]) for r in rows]

    async def finish_import(self) -> None:
        """Move each id sequence past the copied ids, so new rows do not collide with them;
        then VACUUM ANALYZE: the planner gets statistics and the visibility map its index-only
        word lookups need now, not whenever autovacuum comes by after a large copy."""
        async with self._atomic() as tx:
            await advance_sequences(tx.con)
        await self._run(lambda con: con.execute("VACUUM (ANALYZE)"))

    async def ping(self) -> None:
        """One trivial query through the pool (the watchdog's proof the store is not wedged)."""
        await self._val("SELECT 1")
